// Params and work shapes of the EAGLE3 draft's own ops (kernels/eagle3_draft.cuh; the draft's
// linears and norms are native's: native/eagle3_net.h). Layouts: fp32 rows; a row i is the draft
// row at position start + i; the draft's K/V cache [position][kv_dim].
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

// RoPE (Llama: rotate-half pairs (j, j + hd / 2), angle position x inv_freq[j] in double) on the q
// and k heads of each row of qkv ([n][ld]: q nh x hd, k kvh x hd, v kvh x hd): q in place, k and v
// written to the cache at the row's position. Item = row; its angles computed once.
struct DraftRopeParams {
  float* qkv = nullptr;
  int64_t ld = 0;
  const double* inv_freq = nullptr;  // [hd / 2]
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  int n = 0, start = 0, nh = 0, kvh = 0, hd = 0;
};
constexpr int kDraftRopeThreads = 256;
// shared memory: the row's (cos, sin) pairs in double
M3_HOST_DEVICE inline WorkShape draft_rope_shape(const DraftRopeParams& p) {
  return {p.n, kDraftRopeThreads, (p.hd / 2) * 16};
}

// Causal softmax attention of each row's q heads over the cache's positions 0 .. start + i (GQA:
// head h reads kv head h / (nh / kvh)), fp32, split-K so a single row still fills the GPU.
// Item = (row i, kv head g, head group, split sp): the group's q heads (at most kDraftAttnHeads of
// the kv head's nh / kvh) over keys [sp * split_keys, (sp + 1) * split_keys) of the row's; its
// warps take 32-key tiles in turn; in a tile, lane = key for q.k (one read of the key's row for
// all the group's heads), then lane = channels for p.V; an online softmax per warp and head, the
// warps folded in the item. splits == 1: the output written; else each (item, head)'s (m, l, acc)
// goes to `part` and DraftAttnCombineOp folds the splits in order.
constexpr int kDraftAttnHeads = 8;  // q heads an item holds (registers: kDraftAttnHeads x hd / 32 accumulators)
struct DraftAttnParams {
  const float* q = nullptr;  // [n][ld_q]
  int64_t ld_q = 0;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  float* o = nullptr;  // [n][ld_o]: nh x hd
  int64_t ld_o = 0;
  int n = 0, start = 0, nh = 0, kvh = 0, hd = 0;
  float scale = 1.0f;
  int splits = 1, split_keys = 0;  // split_keys: a multiple of 32 covering the longest row when splits == 1
  float* part = nullptr;           // [n][kvh][groups][splits][kDraftAttnHeads][2 + hd] when splits > 1
};
constexpr int kDraftAttnThreads = 256;  // 8 warps
constexpr int kDraftAttnMaxHd = 256;    // head dims a lane holds: hd / 32 <= 8
M3_HOST_DEVICE inline int draft_attn_groups(const DraftAttnParams& p) {
  return (p.nh / p.kvh + kDraftAttnHeads - 1) / kDraftAttnHeads;
}
M3_HOST_DEVICE inline int64_t draft_attn_part_floats(const DraftAttnParams& p) {
  return int64_t(p.n) * p.kvh * draft_attn_groups(p) * p.splits * kDraftAttnHeads * (2 + p.hd);
}
// shared memory: q (kDraftAttnHeads x hd floats), then per warp and head (m, l, acc[hd])
M3_HOST_DEVICE inline WorkShape draft_attn_shape(const DraftAttnParams& p) {
  return {int64_t(p.n) * p.kvh * draft_attn_groups(p) * p.splits, kDraftAttnThreads,
          kDraftAttnHeads * (p.hd + (kDraftAttnThreads / 32) * (2 + p.hd)) * 4};
}
// Item = (row, q head): the splits' states folded in split order.
constexpr int kDraftCombineThreads = 128;
M3_HOST_DEVICE inline WorkShape draft_attn_combine_shape(const DraftAttnParams& p) {
  return {int64_t(p.n) * p.nh, kDraftCombineThreads, 0};
}

// The greedy draft on the device, eagle3_greedy's rule (runtime/eagle3_drafter.h): the target id
// i + d2t[i] (d2t null: i) of the largest of n logits, the lowest target id among equal ones, NaN
// never wins, all -inf or NaN: 0. Written to *out. One item.
struct DraftArgmaxParams {
  const float* logits = nullptr;  // [n]
  int n = 0;
  const int32_t* d2t = nullptr;   // [n] or null
  int32_t* out = nullptr;
};
constexpr int kDraftArgmaxThreads = 1024;
M3_HOST_DEVICE inline WorkShape draft_argmax_shape(const DraftArgmaxParams&) { return {1, kDraftArgmaxThreads, 0}; }

// The SiLU-gated MLP's activation: h[i][c] = silu(gu[i][c]) * gu[i][I + c]. Item = (row, 1024 columns).
struct DraftSiluParams {
  const float* gu = nullptr;  // [n][ld_gu]: gate I, up I
  int64_t ld_gu = 0;
  float* h = nullptr;  // [n][ld_h]
  int64_t ld_h = 0;
  int n = 0, I = 0;
};
constexpr int kDraftSiluThreads = 256;
constexpr int kDraftSiluCols = 1024;  // columns an item: a row's are spread over the GPU
M3_HOST_DEVICE inline int draft_silu_slices(const DraftSiluParams& p) { return (p.I + kDraftSiluCols - 1) / kDraftSiluCols; }
M3_HOST_DEVICE inline WorkShape draft_silu_shape(const DraftSiluParams& p) {
  return {int64_t(p.n) * draft_silu_slices(p), kDraftSiluThreads, 0};
}

}  // namespace m3::kernels
