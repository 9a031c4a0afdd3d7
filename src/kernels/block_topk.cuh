// The MSA top-k block selection of one (token, index group) (docs m3-model.md, "MSA"), shared by
// the indexer's top-k op and the attention split items that select their own blocks.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention_common.cuh"
#include "kernels/group.cuh"

namespace m3::kernels {

constexpr int kTopkChunk = 128;  // blocks per pruning chunk

// The top-k blocks of one (token, index group), by a group of threads (a multiple of 32), from its
// block scores sc[0 .. max_q_blocks) at position pos: over the nb = pos / block_size + 1 visible
// blocks, NaN -> -inf, the `local` blocks ending at pos's block forced to +inf; block i is kept
// iff its score is not -inf and fewer than k blocks beat it (higher score, or equal score and
// lower index), i.e. exactly the top min(k, nb) with ties to the lower index. out[0 .. k): the
// kept block ids ascending, then -1 (pos < 0: all -1); global or shared memory. smem:
// indexer_topk_smem_bytes(max_q_blocks). Exact pruning first: a block beaten by k others inside
// its own chunk of kTopkChunk blocks cannot be kept, and every block that beats a kept block is
// itself kept, so ranking the survivors among themselves gives the same answer. Scans read 8
// scores per step (broadcast 16-byte reads) and stop at k. The first nthreads scores are loaded
// before pos is waited on (blocks past it are read and unused). Synchronizes the group (except
// for pos < 0).
// Callers: the indexer's top-k op (kernels/indexer.cuh) and the attention split item that selects
// its own blocks (kernels/attention.cuh, AttentionParams::topk_scores): the same lists.
__device__ __forceinline__ void block_topk(const float* sc, int pos, int block_size, int local, int k,
                                           int max_q_blocks, Group grp, uint8_t* smem, int32_t* out) {
  const int tid = grp.tid, nthreads = grp.nthreads;
  const float sc0 = tid < max_q_blocks ? sc[tid] : -INFINITY;
  if (pos < 0) {
    for (int i = tid; i < k; i += nthreads) out[i] = -1;
    return;
  }
  const int qb = pos / block_size, nb = qb + 1;
  const int nb8 = (nb + 7) / 8 * 8, cap = (max_q_blocks + 7) / 8 * 8;
  float* s_s = reinterpret_cast<float*>(smem);               // [cap] sanitized scores
  int32_t* keep = reinterpret_cast<int32_t*>(s_s + cap);     // [cap] 1 = selected
  int32_t* cand = keep + cap;                                // [cap + 4] candidate block ids
  float* cand_s = reinterpret_cast<float*>(cand + cap + 4);  // [cap + 4] their scores
  int32_t* ncand = reinterpret_cast<int32_t*>(cand_s + cap + 4);
  if (tid == 0) *ncand = 0;
  for (int b = tid; b < nb8; b += nthreads) {
    float s = b < nb ? (b == tid ? sc0 : sc[b]) : -INFINITY;  // padding never beats a selectable block
    if (s != s) s = -INFINITY;
    if (b < nb && b > qb - local) s = INFINITY;  // b in [qb - local + 1, qb]
    s_s[b] = s;
    keep[b] = 0;
  }
  grp.sync();
  // 1. Candidates: fewer than k better blocks inside the block's own chunk.
  for (int b = tid; b < nb; b += nthreads) {
    const float sb = s_s[b];
    if (!(sb > -INFINITY)) continue;
    const int c0 = b / kTopkChunk * kTopkChunk, c1 = min(c0 + kTopkChunk, nb8);
    int better = 0;
    for (int j0 = c0; j0 < c1 && better < k; j0 += 8) {
      const float4 x = *reinterpret_cast<const float4*>(s_s + j0);
      const float4 y = *reinterpret_cast<const float4*>(s_s + j0 + 4);
      const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
      for (int q = 0; q < 8; ++q) better += (v[q] > sb) || (v[q] == sb && j0 + q < b);
    }
    if (better < k) {
      const int i = atomicAdd(ncand, 1);
      cand[i] = b;
      cand_s[i] = sb;
    }
  }
  grp.sync();
  const int nc = *ncand, nc4 = (nc + 3) / 4 * 4;
  if (tid < nc4 - nc) {  // pad the list to a multiple of 4 with entries that beat nothing
    cand[nc + tid] = INT_MAX;
    cand_s[nc + tid] = -INFINITY;
  }
  grp.sync();
  // 2. Rank among the candidates (order of the list is irrelevant: ties compare block ids).
  for (int i = tid; i < nc; i += nthreads) {
    const int b = cand[i];
    const float sb = cand_s[i];
    int better = 0;
    for (int j0 = 0; j0 < nc4 && better < k; j0 += 4) {
      const float4 x = *reinterpret_cast<const float4*>(cand_s + j0);
      const int4 id = *reinterpret_cast<const int4*>(cand + j0);
      better += (x.x > sb) || (x.x == sb && id.x < b);
      better += (x.y > sb) || (x.y == sb && id.y < b);
      better += (x.z > sb) || (x.z == sb && id.z < b);
      better += (x.w > sb) || (x.w == sb && id.w < b);
    }
    if (better < k) keep[b] = 1;
  }
  grp.sync();
  // Kept blocks in ascending order (warp 0, one ballot per 32 blocks), then -1 padding.
  if (tid < 32) {
    const int lane = tid;
    int count = 0;
    for (int b0 = 0; b0 < nb; b0 += 32) {
      const int b = b0 + lane;
      const bool kb = b < nb && keep[b];
      const unsigned m = __ballot_sync(kFullMask, kb);
      if (kb) out[count + __popc(m & ((1u << lane) - 1u))] = b;
      count += __popc(m);
    }
    for (int i = count + lane; i < k; i += 32) out[i] = -1;
  }
}

}  // namespace m3::kernels
