// MSA indexer (docs m3-model.md, "MSA"), for any number of tokens, in two device functions:
//
// 1. indexer_block_scores_work, work item w = t * max_q_blocks + b (one token, one logical key
//    block), run by a whole thread block: for every visible key j in block b (j <= p_t),
//      s_g[j] = ik_scale * (iq_g . IK[slot(j)])   fp32, no softmax scale,
//    and block_scores[t, g, b] = max_j s_g[j] (NaN never raises a block). Items with b > p_t / bs
//    or padding tokens write nothing (never read).
// 2. indexer_topk_work, work item w = t * IH + g, run by one warp with a scratch of max_q_blocks
//    floats: over the token's nb = p/bs + 1 blocks, NaN -> -inf, the `local` blocks ending at p's
//    block forced to +inf, then min(topk, nb) rounds of warp argmax (higher score first, ties to
//    the lower block index, -inf never selected). Writes selected[t, g, 0..topk) = the selected
//    logical block ids in ascending order, -1 padded (padding tokens: all -1).
//
// Inputs: iq [T, IH*ID] fp32 (normed, rotated); the layer's index-K cache [slots, ID] (FP8 or
// BF16 with one scalar scale, layout in native/kv_cache.h); per-token positions and request rows,
// block_tables [num_seqs, table_width] (physical ids). Block ids written are LOGICAL (block b
// holds positions [b*bs, (b+1)*bs) of the request), so results do not depend on the physical
// placement of blocks.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention_common.cuh"

namespace m3::kernels {

constexpr int kIndexerMaxHeads = 8;

struct IndexerParams {
  const float* iq = nullptr;        // [T, IH*ID]
  const void* ik_cache = nullptr;   // [slots, ID]
  float ik_scale = 1;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* block_tables = nullptr;  // [num_seqs, table_width]
  int table_width = 0;
  int num_tokens = 0, index_heads = 0, index_dim = 0, block_size = 0;
  int max_q_blocks = 0;  // >= p/bs + 1 for every token (bounds the grid and the workspace)
  int topk = 0, local = 0;
  float* block_scores = nullptr;  // [T, IH, max_q_blocks] workspace
  int32_t* selected = nullptr;    // [T, IH, topk]
};

// Thread block of `nthreads` (a multiple of 32) threads; smem: IH*ID + 32*IH floats.
template <class C>
__device__ void indexer_block_scores_work(int64_t w, int tid, int nthreads, float* smem, const IndexerParams& p) {
  const int t = int(w / p.max_q_blocks), b = int(w % p.max_q_blocks);
  const int pos = p.positions[t];
  if (pos < 0 || b > pos / p.block_size) return;  // uniform over the block
  const int IH = p.index_heads, ID = p.index_dim, bs = p.block_size;
  float* q_s = smem;                // [IH][ID]
  float* red = smem + IH * ID;      // [nwarps][IH]
  const float* iq = p.iq + int64_t(t) * IH * ID;
  for (int i = tid; i < IH * ID; i += nthreads) q_s[i] = iq[i];
  __syncthreads();

  const int32_t phys = p.block_tables[int64_t(p.token_seq[t]) * p.table_width + b];
  const int n_keys = min(bs, pos - b * bs + 1);  // visible keys of this block
  using S = typename C::Store;
  constexpr int kChunk = 16 / C::kBytes;  // elements per 16-byte load
  float best[kIndexerMaxHeads];
#pragma unroll
  for (int g = 0; g < kIndexerMaxHeads; ++g) best[g] = -INFINITY;
  for (int k = tid; k < n_keys; k += nthreads) {
    const S* key = static_cast<const S*>(p.ik_cache) + (int64_t(phys) * bs + k) * ID;
    float acc[kIndexerMaxHeads];
#pragma unroll
    for (int g = 0; g < kIndexerMaxHeads; ++g) acc[g] = 0.f;
#pragma unroll 4
    for (int d0 = 0; d0 < ID; d0 += kChunk) {
      float kv[kChunk];
      load_decode<C, kChunk>(key + d0, kv);
#pragma unroll
      for (int g = 0; g < kIndexerMaxHeads; ++g) {
        if (g < IH) {
          const float4* q4 = reinterpret_cast<const float4*>(q_s + g * ID + d0);
#pragma unroll
          for (int e = 0; e < kChunk / 4; ++e) {
            float4 q = q4[e];
            acc[g] = fmaf(q.x, kv[4 * e], acc[g]);
            acc[g] = fmaf(q.y, kv[4 * e + 1], acc[g]);
            acc[g] = fmaf(q.z, kv[4 * e + 2], acc[g]);
            acc[g] = fmaf(q.w, kv[4 * e + 3], acc[g]);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kIndexerMaxHeads; ++g) best[g] = fmaxf(best[g], acc[g] * p.ik_scale);
  }
  const int lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
#pragma unroll
  for (int g = 0; g < kIndexerMaxHeads; ++g) {
    if (g < IH) {
      float m = warp_max(best[g]);
      if (lane == 0) red[warp * IH + g] = m;
    }
  }
  __syncthreads();
  if (tid < IH) {
    float m = -INFINITY;
    for (int i = 0; i < nwarps; ++i) m = fmaxf(m, red[i * IH + tid]);
    p.block_scores[(int64_t(t) * IH + tid) * p.max_q_blocks + b] = m;
  }
}

// One warp; scratch: max_q_blocks floats private to this warp.
__device__ inline void indexer_topk_work(int64_t w, int lane, float* scratch, const IndexerParams& p) {
  const int t = int(w / p.index_heads), g = int(w % p.index_heads);
  int32_t* out = p.selected + (int64_t(t) * p.index_heads + g) * p.topk;
  const int pos = p.positions[t];
  if (pos < 0) {
    for (int i = lane; i < p.topk; i += 32) out[i] = -1;
    return;
  }
  const int qb = pos / p.block_size, nb = qb + 1;
  const float* sc = p.block_scores + (int64_t(t) * p.index_heads + g) * p.max_q_blocks;
  // Load, sanitize, force the local blocks; track this lane's best (score desc, index asc).
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int b = lane; b < nb; b += 32) {
    float s = sc[b];
    if (s != s) s = -INFINITY;
    if (b > qb - p.local) s = INFINITY;  // b in [qb - local + 1, qb]
    scratch[b] = s;
    if (s > bv || (s == bv && b < bi)) { bv = s; bi = b; }
  }
  const int rounds = min(p.topk, nb);
  for (int r = 0; r < rounds; ++r) {
    float v = bv;
    int i = bi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float v2 = __shfl_xor_sync(kFullMask, v, o);
      int i2 = __shfl_xor_sync(kFullMask, i, o);
      if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
    }
    if (v == -INFINITY) break;  // nothing selectable is left (uniform)
    if (i % 32 == lane) {       // the owner marks the winner (NaN = selected) and rescans
      scratch[i] = NAN;
      bv = -INFINITY;
      bi = INT_MAX;
      for (int b = lane; b < nb; b += 32) {
        float s = scratch[b];
        if (s > bv || (s == bv && b < bi)) { bv = s; bi = b; }  // NaN never compares true
      }
    }
  }
  __syncwarp();
  // Selected blocks in ascending order: a ballot per 32 blocks.
  int count = 0;
  for (int b0 = 0; b0 < nb; b0 += 32) {
    int b = b0 + lane;
    bool sel = b < nb && scratch[b] != scratch[b];
    unsigned m = __ballot_sync(kFullMask, sel);
    if (sel) out[count + __popc(m & ((1u << lane) - 1u))] = b;
    count += __popc(m);
  }
  for (int i = count + lane; i < p.topk; i += 32) out[i] = -1;
}

}  // namespace m3::kernels
