// Params and work shapes of paged attention (kernels/attention.cuh): the split work (one item per
// (token, KV group, split)) and the combine of the chunk states.
#pragma once
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/indexer_params.h"
#include "kernels/work.h"

namespace m3::kernels {

// A split item is 8 warps on tensor cores (kernels/attention.cuh): per 32-key tile, warps 0-3 score
// 8 keys each for the group's (up to) 16 heads, warps 4-7 decode the V tile (FP8), each warp runs
// the online softmax of heads w and w + 8, and warp w accumulates output channels 8 (w + 8 i) ..
// + 7 of every head.
constexpr int kAttnWarps = 8;
constexpr int kAttnMaxGroup = 16;  // query heads per KV head: the MMA's 16 rows
constexpr int kAttnTile = 32;      // keys per tile

struct AttentionParams {
  const float* q = nullptr;        // [T, H*D] (normed, rotated)
  const void* k_cache = nullptr;   // [slots, KV, D]
  const void* v_cache = nullptr;   // [slots, KV, D]
  float k_scale = 1, v_scale = 1;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* block_tables = nullptr;  // [num_seqs, table_width]
  int table_width = 0;
  // [T, KV, topk] logical block ids ascending, -1 padded; null (and topk_scores null) = dense. With
  // topk_scores, written by each (t, g)'s split 0 (for traces), not read.
  int32_t* selected = nullptr;
  int topk = 0;
  // Optional: the indexer's block scores [T, KV, max_q_blocks] (index groups = KV heads); each
  // split item then selects its (t, g)'s top-k blocks itself (kernels/block_topk.cuh, with
  // topk_local forced blocks) instead of reading `selected`: the same lists, one op less.
  const float* topk_scores = nullptr;
  int max_q_blocks = 0, topk_local = 0;
  int num_tokens = 0, num_heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  float softmax_scale = 1;
  int num_splits = 1;          // S: thread blocks per (t, g)
  int tiles_per_chunk = 2;     // P: 32-key tiles per chunk (fixed per backend: the numerics depend on it)
  int max_chunks = 1;          // C: chunks of the longest key list of the launch (workspace stride)
  float* out = nullptr;        // [T, H*D]
  uint16_t* out_split = nullptr;  // optional [T][2 H*D]: out split for a decode tile (kernels/act_split.cuh)
  float* part_o = nullptr;     // [T, KV, C, G, D]   (S > 1)
  float* part_ml = nullptr;    // [T, KV, C, G, 2]   (S > 1)
  int32_t* part_n = nullptr;   // [T, KV] chunks of (t, g) (S > 1)
  CacheFmt kv_fmt = CacheFmt::FP8;  // K/V cache elements (instantiation)
};

// Shared memory of one split item (16-byte aligned regions, in this order; byte offsets):
//   qfrag : q of the 16 MMA rows as A fragments, uint4 [3 parts hi/mid/lo][D / 16 steps][32 lanes]
//   bufs  : two buffers of {K tile, V tile: 32 rows of D * elem_bytes + 16 bytes, slots: 32 int32}
//   vdec  : (FP8) the V tile decoded to bf16, 32 rows of 2 D + 16 bytes (ldmatrix, no bank conflict)
//   scores: fp32 [16 heads][40] (a tile's q.k; rows padded against bank conflicts)
//   pfrag : the tile's probabilities as A fragments, uint4 [3 parts][2 steps][32 lanes]
//   heads : fp32 [3][16]: per head, the tile's rescale; at a chunk's end the fold weights a, b
// The group does not change the size (the MMA always has 16 rows, zero past the group).
struct AttnSmemLayout {
  int row_bytes, tile_bytes, buf_bytes, vdec_row;
  int qfrag, bufs, vdec, scores, pfrag, heads, bytes;
  static constexpr int kScoreLd = 40;
  M3_HOST_DEVICE constexpr AttnSmemLayout(int head_dim, int elem_bytes)
      : row_bytes(head_dim * elem_bytes + 16),
        tile_bytes(kAttnTile * row_bytes),
        buf_bytes(2 * tile_bytes + kAttnTile * 4),
        vdec_row(2 * head_dim + 16),
        qfrag(0),
        bufs(qfrag + 3 * (head_dim / 16) * 32 * 16),
        vdec(bufs + 2 * buf_bytes),
        scores(vdec + (elem_bytes == 1 ? kAttnTile * vdec_row : 0)),
        pfrag(scores + kAttnMaxGroup * kScoreLd * 4),
        heads(pfrag + 3 * 2 * 32 * 16),
        bytes(heads + 3 * kAttnMaxGroup * 4) {}
};
M3_HOST_DEVICE constexpr int attention_split_smem_bytes(int head_dim, int elem_bytes) {
  return AttnSmemLayout(head_dim, elem_bytes).bytes;
}
// The split item's shared memory is at most this (launches above 48 KB raise the kernel's limit).
constexpr int kAttnSplitSmemCap = 64 * 1024;
M3_HOST_DEVICE constexpr int attention_topk_list_bytes(int topk) { return (topk * 4 + 15) / 16 * 16; }
// With topk_scores, the selection's scratch (indexer_topk_smem_bytes) lives in the two K/V buffers
// (before the first tile is copied) and the selected list after everything else: when the scratch
// fits there and the item with its list stays within kAttnSplitSmemCap (the plan falls back to the
// top-k op otherwise).
M3_HOST_DEVICE inline bool attention_topk_fits(int head_dim, int elem_bytes, int max_q_blocks, int topk) {
  return indexer_topk_smem_bytes(max_q_blocks) <= 2 * AttnSmemLayout(head_dim, elem_bytes).buf_bytes &&
         attention_split_smem_bytes(head_dim, elem_bytes) + attention_topk_list_bytes(topk) <= kAttnSplitSmemCap;
}
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kAttnCombineThreads = 256;

// Output channels of one combine work item, and work items per (token, KV group).
M3_HOST_DEVICE inline int attention_combine_chunks(int group, int head_dim, int nthreads) {
  return (group * head_dim + nthreads - 1) / nthreads;
}

M3_HOST_DEVICE inline int attention_combine_smem_floats(int group, int max_chunks) {
  return group * (2 * max_chunks + 1);
}

// Split: item w = (t * KV + g) * S + s. Combine: item w = (t * KV + g) * slices + c.
M3_HOST_DEVICE inline WorkShape attention_split_shape(const AttentionParams& p) {
  return {int64_t(p.num_tokens) * p.kv_heads * p.num_splits, kAttnThreads,
          attention_split_smem_bytes(p.head_dim, p.kv_fmt == CacheFmt::FP8 ? 1 : 2) +
              (p.topk_scores ? attention_topk_list_bytes(p.topk) : 0)};
}
M3_HOST_DEVICE inline WorkShape attention_combine_shape(const AttentionParams& p) {
  const int G = p.num_heads / p.kv_heads;
  return {int64_t(p.num_tokens) * p.kv_heads * attention_combine_chunks(G, p.head_dim, kAttnCombineThreads),
          kAttnCombineThreads, attention_combine_smem_floats(G, p.max_chunks) * 4};
}

}  // namespace m3::kernels
