// Params and work shape of the weight-streaming GEMV (kernels/gemv.cuh).
#pragma once
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/fused_norm_params.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kGemvThreads = 128;  // threads per work item: the reduction order depends on it

struct GemvParams {
  const uint8_t* w = nullptr;      // [N][ld_w bytes]
  const float* w_scale = nullptr;  // [N] (FP8 only)
  int64_t ld_w = 0;
  const void* x = nullptr;         // [M][ld_x] bf16 or fp32
  int64_t ld_x = 0;
  float* y = nullptr;              // [M][ld_y]
  int64_t ld_y = 0;
  int N = 0, K = 0, M = 0;
  int swiglu = 0;                  // 1: interleaved gate/up rows, N even, y has N/2 columns
  float alpha = 1.702f, limit = 7.0f;
  // Launch layout (native::make_gemv_params): tokens per pass, formats, and the token groups
  // (one item per (rows, mt tokens) once M > mt; else one group of all M tokens).
  int mt = 1;                      // 1, 2, 4, 8 or 16
  WeightFmt wfmt = WeightFmt::FP8;
  ActFmt xfmt = ActFmt::F32;
  int token_groups = 1;
  // R: rows per work item, gemv_rows_per_item(mt) or, for a small N at mt <= 4 without SwiGLU, 1
  // (more items over the GPU: the router's 128 rows were 32 items of 98 KB each, 100 SMs idle), or
  // for many token groups at mt 16 without SwiGLU kGemvPrefillRows (gemv_rows_ok).
  // A row's sum does not depend on R (thread i's chunks in order, block_sum per value).
  int rows = 4;
  NormIn nin;  // fused RMS norm (fused_norm_params.h): outputs times their token's inv
};

// Rows per work item (the default R) and chunks in flight per row, by tokens per pass and R.
M3_HOST_DEVICE constexpr int gemv_rows_per_item(int mt) { return mt <= 4 ? 4 : 2; }
// R for prefill-sized M at 16 tokens per pass without SwiGLU: a token group's activations read once
// per 4 rows instead of per 2 (the F32 router over 8K tokens re-read them 64 times; at 8 rows the
// 128 accumulators spill).
constexpr int kGemvPrefillRows = 4;
M3_HOST_DEVICE constexpr bool gemv_rows_ok(int mt, int rows, bool swiglu) {
  return rows == gemv_rows_per_item(mt) || (rows == 1 && !swiglu && mt <= 4) ||
         (rows == kGemvPrefillRows && !swiglu && mt == 16);
}
// R = 1 at one or two tokens (the router): 12 chunks, so that the F32 router's rows of 6144 (1536
// chunks: 12 a thread) are loaded in one round instead of two (8 + 4); the sums' order does not
// depend on it.
M3_HOST_DEVICE constexpr int gemv_chunks_in_flight(int mt, int rows) {
  return rows == 1 ? (mt <= 2 ? 12 : 4) : (mt <= 2 ? 4 : 2);
}
// The block sums (MT x R values per warp), then the fused norm's inv per token.
M3_HOST_DEVICE constexpr int gemv_inv_offset_floats(int mt, int rows) { return (kGemvThreads / 32) * mt * rows; }
M3_HOST_DEVICE constexpr int gemv_smem_floats(int mt, int rows) {
  return gemv_inv_offset_floats(mt, rows) + kFusedNormMaxRows;
}
M3_HOST_DEVICE inline int gemv_work_items(int N, int rows) { return int(ceil_div(N, rows)); }

// Work item w = (row item w % gemv_work_items, token group w / gemv_work_items).
M3_HOST_DEVICE inline WorkShape gemv_shape(const GemvParams& p) {
  return {int64_t(gemv_work_items(p.N, p.rows)) * p.token_groups, kGemvThreads, gemv_smem_floats(p.mt, p.rows) * 4};
}

}  // namespace m3::kernels
