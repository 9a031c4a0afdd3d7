// Gemma RMS norm with a fused residual add (kernels/rmsnorm.cuh), M rows of n elements:
//   r = x + residual (when given; stored to residual_out when given), y = r / rms(r) * (1 + w).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::native {

struct RmsNormArgs {
  const float* x = nullptr;          // [M][ld_x]
  int64_t ld_x = 0;
  const float* residual = nullptr;   // optional [M][ld_res]
  int64_t ld_res = 0;
  float* residual_out = nullptr;     // optional [M][ld_res_out] (may alias x or residual)
  int64_t ld_res_out = 0;
  const uint16_t* w = nullptr;       // [n] bf16 (prepared norm weight)
  float* y = nullptr;                // optional fp32 [M][ld_y]
  int64_t ld_y = 0;
  uint16_t* y_bf16 = nullptr;        // optional bf16 [M][ld_yb]
  int64_t ld_yb = 0;
  int n = 0, M = 0;
  float eps = 1e-6f;
};
void rms_norm(const RmsNormArgs& a, cudaStream_t stream);

}  // namespace m3::native
