// MSA indexer (docs m3-model.md, "MSA"), for any number of tokens, in two device functions:
//
// 1. indexer_block_scores_work, work item w = t * max_q_blocks + b (one token, one logical key
//    block), run by a whole thread block: for every visible key j in block b (j <= p_t),
//      s_g[j] = ik_scale * (iq_g . IK[slot(j)])   fp32, no softmax scale,
//    and block_scores[t, g, b] = max_j s_g[j] (NaN never raises a block). Items with b > p_t / bs
//    or padding tokens write nothing (never read).
// 2. indexer_topk_work (kernels/block_topk.cuh), work item w = t * IH + g, run by a thread
//    group: over the token's nb = p/bs + 1 blocks, NaN -> -inf, the `local` blocks ending at p's
//    block forced to +inf; block b is kept iff its score is not -inf and fewer than topk blocks
//    beat it (higher score, or equal score and lower index), which is exactly the top
//    min(topk, nb) with ties to the lower index. Writes selected[t, g, 0..topk) = the kept logical
//    block ids in ascending order, -1 padded (padding tokens: all -1). The attention split items
//    can run the same selection themselves instead (AttentionParams::topk_scores).
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
#include "kernels/block_topk.cuh"
#include "kernels/indexer_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

// One thread's share of a block's scores: for its keys k = tid, tid + nthreads, ... < n_keys (rows of
// `keys`, row_bytes apart, in the cache format C), best[g] = max over them of scale * (q_g . key_k)
// for each head g < IH (q: [IH][ID] fp32 in shared memory; the fma order over d fixed), -inf for
// none. The single-token and the token-tiled items both score through it (the same bits).
template <class C>
__device__ __forceinline__ void keys_best(const float* q, const uint8_t* keys, int row_bytes, int n_keys, int tid,
                                          int nthreads, int IH, int ID, float scale, float (&best)[kIndexerMaxHeads]) {
  using S = typename C::Store;
  constexpr int kChunk = 16 / C::kBytes;  // elements per 16-byte load
#pragma unroll
  for (int g = 0; g < kIndexerMaxHeads; ++g) best[g] = -INFINITY;
  for (int k = tid; k < n_keys; k += nthreads) {
    const S* key = reinterpret_cast<const S*>(keys + k * row_bytes);
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
          const float4* q4 = reinterpret_cast<const float4*>(q + g * ID + d0);
#pragma unroll
          for (int e = 0; e < kChunk / 4; ++e) {
            float4 qv = q4[e];
            acc[g] = fmaf(qv.x, kv[4 * e], acc[g]);
            acc[g] = fmaf(qv.y, kv[4 * e + 1], acc[g]);
            acc[g] = fmaf(qv.z, kv[4 * e + 2], acc[g]);
            acc[g] = fmaf(qv.w, kv[4 * e + 3], acc[g]);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kIndexerMaxHeads; ++g) best[g] = fmaxf(best[g], acc[g] * scale);
  }
}

// A group of any multiple of 32 threads (at most 1024); smem (16-byte aligned):
// indexer_scores_smem_bytes() bytes.
template <class C>
__device__ void indexer_block_scores_work(const IndexerParams& p, int64_t w, Group grp, uint8_t* smem) {
  const int tid = grp.tid, nthreads = grp.nthreads;
  const ItemSplit wb = item_split(w, p.max_q_blocks);
  const int t = int(wb.q), b = wb.r;
  // The position and the request load together, and the block's physical id as soon as the
  // request is known (not after the position: b < table_width keeps it in bounds; a block past
  // the position is loaded and unused).
  const int pos = p.positions[t];
  const int32_t seq = p.token_seq[t];
  const int32_t phys = seq >= 0 && b < p.table_width ? p.block_tables[int64_t(seq) * p.table_width + b] : -1;
  if (pos < 0 || b > pos / p.block_size) return;  // uniform over the block
  const int IH = p.index_heads, ID = p.index_dim, bs = p.block_size;
  float* q_s = reinterpret_cast<float*>(smem);  // [IH][ID]
  float* red = q_s + IH * ID;                   // [nwarps][IH]
  uint8_t* keys = reinterpret_cast<uint8_t*>(red + 32 * IH);
  const int row_bytes = ID * C::kBytes + 16, cpr = ID * C::kBytes / 16;

  // The block's visible keys: one asynchronous copy, overlapping the iq load.
  const int n_keys = min(bs, pos - b * bs + 1);
  const uint8_t* src = static_cast<const uint8_t*>(p.ik_cache) + int64_t(phys) * bs * ID * C::kBytes;
  for (int i = tid; i < n_keys * cpr; i += nthreads) {
    const int key = i / cpr, part = i % cpr;
    cp_async_16(keys + key * row_bytes + part * 16, src + (int64_t(key) * ID * C::kBytes + part * 16), 16);
  }
  cp_async_commit();
  const float* iq = p.iq + int64_t(t) * IH * ID;
  for (int i = tid; i < IH * ID / 4; i += nthreads)
    reinterpret_cast<float4*>(q_s)[i] = reinterpret_cast<const float4*>(iq)[i];
  cp_async_wait<0>();
  grp.sync();

  float best[kIndexerMaxHeads];
  keys_best<C>(q_s, keys, row_bytes, n_keys, tid, nthreads, IH, ID, p.ik_scale, best);
  const int lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
#pragma unroll
  for (int g = 0; g < kIndexerMaxHeads; ++g) {
    if (g < IH) {
      float m = warp_max(best[g]);
      if (lane == 0) red[warp * IH + g] = m;
    }
  }
  grp.sync();
  if (tid < IH) {
    float m = -INFINITY;
    for (int i = 0; i < nwarps; ++i) m = fmaxf(m, red[i * IH + tid]);
    p.block_scores[(int64_t(t) * IH + tid) * p.max_q_blocks + b] = m;
  }
}

// The same scores for the kIndexerTokTile consecutive tokens of item w = tile * max_q_blocks + b:
// every token's dot products are the ones of indexer_block_scores_work (the same decoded keys, the
// same q from shared memory, the same fma order over d), and a block score is a max, which does
// not depend on which thread saw which key. The block's keys are copied once for a run of tokens
// of one request (and again where the tile crosses into another request's table); the tile's iq
// rows are copied first, the warp maxima kept per token, the outputs written at the end.
template <class C>
__device__ void indexer_block_scores_tiled_work(const IndexerParams& p, int64_t w, Group grp, uint8_t* smem) {
  constexpr int TT = kIndexerTokTile;
  const int tid = grp.tid, nthreads = grp.nthreads, lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
  const int b = int(w % p.max_q_blocks), t0 = int(w / p.max_q_blocks) * TT;
  const int tn = min(TT, p.num_tokens - t0);
  const int IH = p.index_heads, ID = p.index_dim, bs = p.block_size;
  float* q_s = reinterpret_cast<float*>(smem);  // [TT][IH][ID]
  float* red = q_s + TT * IH * ID;              // [TT][32][IH]
  uint8_t* keys = reinterpret_cast<uint8_t*>(red + TT * 32 * IH);
  const int row_bytes = ID * C::kBytes + 16, cpr = ID * C::kBytes / 16;
  auto visible = [&](int t) {
    const int pos = p.positions[t];
    return pos >= 0 && b <= pos / bs;
  };
  auto phys_of = [&](int t) { return p.block_tables[int64_t(p.token_seq[t]) * p.table_width + b]; };

  for (int i = tid; i < tn * IH * ID / 4; i += nthreads)
    reinterpret_cast<float4*>(q_s)[i] = reinterpret_cast<const float4*>(p.iq + int64_t(t0) * IH * ID)[i];
  int loaded = -1;  // the physical block in `keys`
  for (int j = 0; j < tn; ++j) {
    const int t = t0 + j;
    if (!visible(t)) continue;  // uniform
    const int phys = phys_of(t);
    if (phys != loaded) {  // the keys the run of tokens with this block needs: up to its last visible key
      int n_load = 0;
      for (int u = j; u < tn; ++u)
        if (visible(t0 + u) && phys_of(t0 + u) == phys) n_load = max(n_load, min(bs, p.positions[t0 + u] - b * bs + 1));
      grp.sync();  // every thread is done with the previous keys (and, the first time, the iq copy is issued)
      const uint8_t* src = static_cast<const uint8_t*>(p.ik_cache) + int64_t(phys) * bs * ID * C::kBytes;
      for (int i = tid; i < n_load * cpr; i += nthreads) {
        const int key = i / cpr, part = i % cpr;
        cp_async_16(keys + key * row_bytes + part * 16, src + (int64_t(key) * ID * C::kBytes + part * 16), 16);
      }
      cp_async_commit();
      cp_async_wait<0>();
      grp.sync();
      loaded = phys;
    }
    const int n_keys = min(bs, p.positions[t] - b * bs + 1);
    const float* q = q_s + j * IH * ID;
    float best[kIndexerMaxHeads];
    keys_best<C>(q, keys, row_bytes, n_keys, tid, nthreads, IH, ID, p.ik_scale, best);
#pragma unroll
    for (int g = 0; g < kIndexerMaxHeads; ++g) {
      if (g < IH) {
        const float m = warp_max(best[g]);
        if (lane == 0) red[(j * 32 + warp) * IH + g] = m;
      }
    }
  }
  grp.sync();
  for (int i = tid; i < tn * IH; i += nthreads) {
    const int j = i / IH, g = i % IH, t = t0 + j;
    if (!visible(t)) continue;
    float m = -INFINITY;
    for (int v = 0; v < nwarps; ++v) m = fmaxf(m, red[(j * 32 + v) * IH + g]);
    p.block_scores[(int64_t(t) * IH + g) * p.max_q_blocks + b] = m;
  }
}

// Item w = t * IH + g: the top-k of (token t, index group g) into selected (kernels/block_topk.cuh).
__device__ inline void indexer_topk_work(const IndexerParams& p, int64_t w, Group grp, uint8_t* smem) {
  const ItemSplit wt = item_split(w, p.index_heads);
  const int t = int(wt.q), g = wt.r;
  const int64_t row = int64_t(t) * p.index_heads + g;
  block_topk(p.block_scores + row * p.max_q_blocks, p.positions[t], p.block_size, p.local, p.topk, p.max_q_blocks,
             grp, smem, p.selected + row * p.topk);
}

// ---- the ops (indexer_params.h shapes) ----
template <class C>
struct IndexerScoresOp : OpBounds<kIndexerScoreThreads> {
  using Params = IndexerParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    indexer_block_scores_work<C>(p, w, g, smem);
  }
};
// Native prefill: tok_tile > 1 (the same bits as IndexerScoresOp).
template <class C>
struct IndexerScoresTiledOp : OpBounds<kIndexerScoreThreads> {
  using Params = IndexerParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    indexer_block_scores_tiled_work<C>(p, w, g, smem);
  }
};
struct IndexerTopkOp : OpBounds<kIndexerTopkThreads> {
  using Params = IndexerParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) { indexer_topk_work(p, w, g, smem); }
};

}  // namespace m3::kernels
