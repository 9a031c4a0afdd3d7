// embed launcher: one 256-thread item per token.
#include "kernels/embedding.cuh"
#include "native/cuda_check.h"
#include "native/embed.h"
#include "native/launch.cuh"

namespace m3::native {

kernels::EmbedParams make_embed_params(const kernels::EmbedParams& p) {
  M3_CHECK(p.table && p.ids && p.V > 0 && p.H > 0 && p.M > 0 && p.ld >= p.H, "embed: bad arguments (V {}, H {}, M {})",
           p.V, p.H, p.M);
  M3_CHECK(p.out || p.out_bf16, "embed: no output");
  M3_CHECK((!p.out || p.ld_out >= p.H) && (!p.out_bf16 || p.ld_ob >= p.H), "embed: output ld smaller than H {}", p.H);
  return p;
}

void launch(const kernels::EmbedParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::EmbedOp>(p, kernels::embed_shape(p), stream, "embed", opt);
}

void embed(const kernels::EmbedParams& p, cudaStream_t stream) { launch(make_embed_params(p), stream); }

}  // namespace m3::native
