// Gemma RMS norm with the residual add fused in front (m3-model.md, "Norm"), one token row:
//   r = x + residual (or x alone),  y = r / sqrt(mean(r^2) + eps) * (1 + w)
// fp32 math; the sum of squares is per-thread sequential, then a fixed-order block reduction, so
// the result does not depend on timing. Layouts: x, residual, residual_out [M][ld] fp32,
// w [n] bf16, y [M][ld_y] fp32 and/or y_bf16 [M][ld_yb] bf16 (round to nearest even).
// residual_out (r) may alias x or residual; y may alias x when there is no residual_out.
#pragma once
#include <cstdint>

#include "core/codecs.h"
#include "kernels/weight_stream.cuh"

namespace m3::kernels {

struct RmsNormParams {
  const float* x = nullptr;
  int64_t ld_x = 0;
  const float* residual = nullptr;  // optional
  int64_t ld_res = 0;
  float* residual_out = nullptr;    // optional: r is stored here
  int64_t ld_res_out = 0;
  const uint16_t* w = nullptr;      // [n] bf16
  float* y = nullptr;               // optional fp32 output
  int64_t ld_y = 0;
  uint16_t* y_bf16 = nullptr;       // optional bf16 output
  int64_t ld_yb = 0;
  int n = 0, M = 0;
  float eps = 1e-6f;
};

// Work item = row; all NT threads of the block call it. smem: NT / 32 floats.
template <int NT>
__device__ __forceinline__ void rmsnorm_work(const RmsNormParams& p, int row, int tid, float* smem) {
  const float* x = p.x + int64_t(row) * p.ld_x;
  const float* res = p.residual ? p.residual + int64_t(row) * p.ld_res : nullptr;
  float* ro = p.residual_out ? p.residual_out + int64_t(row) * p.ld_res_out : nullptr;
  float ss = 0.f;
  for (int i = tid; i < p.n; i += NT) {
    float r = x[i];
    if (res) r += res[i];
    if (ro) ro[i] = r;
    ss = fmaf(r, r, ss);
  }
  float part[1] = {ss};
  wstream::block_sum<1, NT>(part, tid, smem);
  const float inv = 1.0f / sqrtf(smem[0] / float(p.n) + p.eps);
  for (int i = tid; i < p.n; i += NT) {
    const float r = ro ? ro[i] : (res ? x[i] + res[i] : x[i]);
    const float v = r * inv * (1.0f + bf16_to_f32(p.w[i]));
    if (p.y) p.y[int64_t(row) * p.ld_y + i] = v;
    if (p.y_bf16) p.y_bf16[int64_t(row) * p.ld_yb + i] = f32_to_bf16(v);
  }
  __syncthreads();  // smem reuse
}

}  // namespace m3::kernels
