// Params and work shape of the Gemma RMS norm with a fused residual add (kernels/rmsnorm.cuh).
// Layouts: x, residual, residual_out [M][ld] fp32, w [n] bf16, y [M][ld_y] fp32 and/or y_bf16
// [M][ld_yb] bf16. residual_out may alias x or residual; y may alias x when there is no residual_out.
#pragma once
#include <cstdint>

#include "kernels/fused_norm_params.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kNormThreads = 256;  // threads per row: the reduction order depends on it
constexpr int kNormVec = 8;        // float4s per thread in the register body: rows up to 8192 floats

struct RmsNormParams {
  const float* x = nullptr;         // [M][ld_x]
  int64_t ld_x = 0;
  const float* residual = nullptr;  // optional [M][ld_res]
  int64_t ld_res = 0;
  float* residual_out = nullptr;    // optional: r = x + residual is stored here
  int64_t ld_res_out = 0;
  const uint16_t* w = nullptr;      // [n] bf16
  float* y = nullptr;               // optional fp32 output
  int64_t ld_y = 0;
  uint16_t* y_bf16 = nullptr;       // optional bf16 output
  int64_t ld_yb = 0;
  int n = 0, M = 0;
  float eps = 1e-6f;
  int regs = 0;  // body (set by native::make_rmsnorm_params): 1 = the row in registers, 0 = strided
  // The prep half of the norm (kernels/fused_norm_params.h; n % 16 == 0): y = r * (1 + w) and
  // inv[row] instead of the normalized row (no y_bf16).
  int prep = 0;
  float* inv = nullptr;  // [M] (prep)
  uint16_t* y_split = nullptr;  // optional (prep): y split for a decode tile, [M][2 ld_y] (kernels/act_split.cuh)
};

// Work item = row; kNormThreads threads; smem: one float per warp, or (prep) the row's chunk sums.
M3_HOST_DEVICE inline WorkShape rmsnorm_shape(const RmsNormParams& p) {
  const int floats = p.prep ? norm_chunks(p.n) : kNormThreads / 32;
  return {p.M, kNormThreads, floats * 4};
}

}  // namespace m3::kernels
