// Launcher of the qkv projection that ropes (kernels/mma_rope.cuh): one instantiation per norm mode
// of the projection's input. Off by default: measured slower (H100 2026-12-07 14:08, docs/perf.md).
#include "kernels/mma_rope.cuh"
#include "native/cuda_check.h"
#include "native/env_switch.h"
#include "native/launch.cuh"
#include "native/mma_rope.h"

namespace m3::native {

namespace {
EnvSwitch g_rope_last("M3_ROPE_LAST", false);
}

bool mma_rope_enabled() { return g_rope_last.on(); }
void set_mma_rope(int on) { g_rope_last.set(on); }

kernels::MmaRopeParams make_mma_rope_params(const kernels::MmaLinearParams& mma,
                                            const kernels::QkNormRopeCacheParams& rope, int32_t* arrivals) {
  M3_CHECK(arrivals, "mma_rope: no arrival counters");
  M3_CHECK(kernels::mma_rope_fits(mma, rope),
           "mma_rope: the projection ({} x {} rows, {} tokens, tile {} x {}{}{}, {} activations) and the rope op ({} "
           "tokens, heads {} + 2 x {} of {}, index {} of {}, rows {}the projection's output) do not fuse",
           mma.N, mma.K, mma.M, mma.rt, mma.nt, mma.deep ? " deep" : "", mma.stream ? " streamed" : "",
           mma.xfmt == kernels::ActFmt::F32Split ? "split" : "unsplit", rope.num_tokens, rope.num_heads, rope.kv_heads,
           rope.head_dim, rope.index_heads, rope.index_dim, rope.proj == mma.y ? "" : "not ");
  return kernels::MmaRopeParams{mma, rope, arrivals};
}

void launch(const kernels::MmaRopeParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  using namespace kernels;
  const WorkShape sh = mma_rope_shape(p);
  switch (mma_norm_mode(p.mma)) {
    case kNormIn: return launch_op<MmaRopeOp<kNormIn, 4, 1>>(p, sh, stream, "mma_rope", opt);
    case kNormNone: return launch_op<MmaRopeOp<kNormNone, 4, 1>>(p, sh, stream, "mma_rope", opt);
    default: M3_FAIL("mma_rope: the projection's norm mode {} (no epilogue into the residual here)", mma_norm_mode(p.mma));
  }
}

}  // namespace m3::native
