// The qkv projection and the per-head norm + RoPE + cache insert in one op for decode
// (mma_rope_params.h MmaRopeParams): every item computes its 16 rows exactly as MmaDecodeOp does
// (FP8 weights over split activations), then counts itself in on its vector's counter; the item
// that completes a vector runs qk_norm_rope_cache_work for it, one warp a token. One op and one
// dependency hop less on every layer's chain (native: a launch; mono: a counter wait), the same
// bits: the rope work reads the same fp32 rows and writes the same q / iq rows and cache entries.
#pragma once
#include <cstdint>

#include "kernels/arrival.cuh"
#include "kernels/mma_linear.cuh"
#include "kernels/mma_rope_params.h"
#include "kernels/qk_norm_rope_cache.cuh"

namespace m3::kernels {

// qk_norm_rope_cache_work with the cache formats read from p (one body for the four pairs).
__device__ __forceinline__ void qk_norm_rope_cache_any(int64_t w, int lane, const QkNormRopeCacheParams& p) {
  const bool kv8 = p.kv_fmt == CacheFmt::FP8, ik8 = p.ik_fmt == CacheFmt::FP8;
  if (kv8 && ik8) qk_norm_rope_cache_work<CacheFp8, CacheFp8>(w, lane, p);
  else if (kv8) qk_norm_rope_cache_work<CacheFp8, CacheBf16>(w, lane, p);
  else if (ik8) qk_norm_rope_cache_work<CacheBf16, CacheFp8>(w, lane, p);
  else qk_norm_rope_cache_work<CacheBf16, CacheBf16>(w, lane, p);
}

// NORM, NG, UW: MmaDecodeOp's (the tile's norm mode and whole walk).
template <int NORM = kNormNone, int NG = 2, int UW = mma::kWholeU>
struct MmaRopeOp : OpBounds<kMmaMaxChains * 32, 0, 128> {
  using Params = MmaRopeParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    mma_linear_wide_item<WeightFmt::FP8, ActFmt::F32Split, 1, 1, NORM, NG, UW>(p.mma, w, g, smem);  // ends synced
    // one token tile (mma_rope_fits): item w is row tile w
    const RopeVector v = rope_vector_of_row(p.rope, int(w) * 16);
    if (!arrive_last(p.arrivals + v.index, v.dim / 16, g, reinterpret_cast<int32_t*>(smem))) return;
    const int nvec = p.rope.vectors_per_token();
    for (int t = g.warp(); t < p.rope.num_tokens; t += g.num_warps())
      qk_norm_rope_cache_any(int64_t(t) * nvec + v.index, g.lane(), p.rope);  // no shared memory
  }
};

}  // namespace m3::kernels
