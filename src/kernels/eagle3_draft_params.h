// Params and work shapes of the EAGLE3 draft's own ops (kernels/eagle3_draft.cuh; the draft's
// linears and norms are native's: native/eagle3_net.h). Layouts: fp32 rows; a row i is the draft
// row at position start + i; the draft's K/V cache [position][kv_dim].
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

// RoPE (Llama: rotate-half pairs (j, j + hd / 2), angle position x inv_freq[j] in double) on the q
// and k heads of each row of qkv ([n][ld]: q nh x hd, k kvh x hd, v kvh x hd): q in place, k and v
// written to the cache at the row's position. Item = row.
struct DraftRopeParams {
  float* qkv = nullptr;
  int64_t ld = 0;
  const double* inv_freq = nullptr;  // [hd / 2]
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  int n = 0, start = 0, nh = 0, kvh = 0, hd = 0;
};
constexpr int kDraftRopeThreads = 128;
M3_HOST_DEVICE inline WorkShape draft_rope_shape(const DraftRopeParams& p) { return {p.n, kDraftRopeThreads, 0}; }

// Causal softmax attention of each row's q heads over the cache's positions 0 .. start + i (GQA:
// head h reads kv head h / (nh / kvh)), fp32 with an online softmax per warp. Item = (row, head).
struct DraftAttnParams {
  const float* q = nullptr;  // [n][ld_q]
  int64_t ld_q = 0;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  float* o = nullptr;  // [n][ld_o]: nh x hd
  int64_t ld_o = 0;
  int n = 0, start = 0, nh = 0, kvh = 0, hd = 0;
  float scale = 1.0f;
};
constexpr int kDraftAttnThreads = 128;  // 4 warps: keys j = warp, warp + 4, ...
constexpr int kDraftAttnMaxHd = 256;    // head dims a lane holds: hd / 32 <= 8
M3_HOST_DEVICE inline WorkShape draft_attn_shape(const DraftAttnParams& p) {
  return {int64_t(p.n) * p.nh, kDraftAttnThreads, (kDraftAttnThreads / 32) * (2 + p.hd) * 4};
}

// The SiLU-gated MLP's activation: h[i][c] = silu(gu[i][c]) * gu[i][I + c]. Item = row.
struct DraftSiluParams {
  const float* gu = nullptr;  // [n][ld_gu]: gate I, up I
  int64_t ld_gu = 0;
  float* h = nullptr;  // [n][ld_h]
  int64_t ld_h = 0;
  int n = 0, I = 0;
};
constexpr int kDraftSiluThreads = 256;
M3_HOST_DEVICE inline WorkShape draft_silu_shape(const DraftSiluParams& p) { return {p.n, kDraftSiluThreads, 0}; }

}  // namespace m3::kernels
