// The qkv projection whose last item of each head runs that head's norm, RoPE and cache insert
// (kernels/mma_rope.cuh; decode): the FP8 decode tile's items as MmaDecodeOp runs them (16 rows of
// the fused [q | k | v | iq | ik] row an item, one token tile), each adding 1 to its vector's
// arrival counter once its rows are written; the item that brings a vector's counter to the
// vector's tile count (head_dim / 16 or index_dim / 16) resets it to 0 and runs
// qk_norm_rope_cache_work for that vector and every token. The same projections, q / iq rows and
// cache entries as the projection then the rope op, one op less on the chain.
#pragma once
#include <cstdint>

#include "kernels/mma_params.h"
#include "kernels/qk_norm_rope_params.h"

namespace m3::kernels {

struct MmaRopeParams {
  MmaLinearParams mma;          // mma.y == rope.proj, mma.ld_y == rope.proj_stride
  QkNormRopeCacheParams rope;
  int32_t* arrivals = nullptr;  // [rope.vectors_per_token()], 0 between launches
};

// The vector (q heads, k heads, v heads, iq heads, ik: the rope op's order) that row n of the fused
// projection belongs to, and its width. Every vector is a whole number of 16-row tiles
// (mma_rope_fits), so one tile lies in one vector.
struct RopeVector {
  int index = 0, dim = 0;
};
M3_HOST_DEVICE inline RopeVector rope_vector_of_row(const QkNormRopeCacheParams& p, int n) {
  const int heads_end = (p.num_heads + 2 * p.kv_heads) * p.head_dim;
  if (n < heads_end) return {n / p.head_dim, p.head_dim};
  return {p.num_heads + 2 * p.kv_heads + (n - heads_end) / p.index_dim, p.index_dim};
}

// Where the fusion applies: the FP8 decode tile (1 x 1, wide, the register walk) over activations
// split by their producer, one token tile, no epilogue into the residual, and the rope op reading
// exactly the tile's output with every vector a whole number of tiles.
M3_HOST_DEVICE inline bool mma_rope_fits(const MmaLinearParams& m, const QkNormRopeCacheParams& r) {
  const int width = (r.num_heads + 2 * r.kv_heads) * r.head_dim + (r.index_heads > 0 ? (r.index_heads + 1) * r.index_dim : 0);
  return m.wfmt == WeightFmt::FP8 && m.xfmt == ActFmt::F32Split && m.rt == 1 && m.nt == 1 && !m.deep && !m.stream &&
         !m.swiglu && !m.nout.res && m.M == r.num_tokens && m.M >= 1 && m.M <= 8 && m.y == r.proj &&
         m.ld_y == r.proj_stride && m.N == width && r.head_dim % 16 == 0 && (r.index_heads == 0 || r.index_dim % 16 == 0);
}

M3_HOST_DEVICE inline WorkShape mma_rope_shape(const MmaRopeParams& p) { return mma_linear_shape(p.mma); }

}  // namespace m3::kernels
