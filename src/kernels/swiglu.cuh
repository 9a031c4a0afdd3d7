// SwiGLU-OAI activation (m3-model.md, "FFN"), one element, fp32:
//   g = min(gate, limit), u = clamp(up, -limit, limit), h = (u + 1) * g * sigmoid(alpha * g).
// Host and device (the CPU reference computes the same formula in double).
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define M3_SWIGLU_HD __host__ __device__ __forceinline__
#else
#define M3_SWIGLU_HD inline
#endif

namespace m3::kernels {

M3_SWIGLU_HD float swiglu_oai_f32(float gate, float up, float alpha, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  const float sig = 1.0f / (1.0f + expf(-alpha * g));
  return (u + 1.0f) * g * sig;
}

}  // namespace m3::kernels
