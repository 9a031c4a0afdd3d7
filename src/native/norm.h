// Gemma RMS norm with a fused residual add (kernels/rmsnorm.cuh), M rows of n elements:
//   r = x + residual (when given; stored to residual_out when given), y = r / rms(r) * (1 + w).
// make_rmsnorm_params checks the params (naming the bad field) and picks the body from the shapes
// and alignment only (rows of up to 8192 aligned floats in registers, others strided).
#pragma once
#include "kernels/rmsnorm_params.h"
#include "native/launch.h"

namespace m3::native {

kernels::RmsNormParams make_rmsnorm_params(kernels::RmsNormParams p);
void launch(const kernels::RmsNormParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
// make + launch.
void rms_norm(const kernels::RmsNormParams& p, cudaStream_t stream);
// Llama's RMS norm (y = r / rms(r) * w; no prep half): the EAGLE3 draft's (native/eagle3_net.h).
void llama_rms_norm(kernels::RmsNormParams p, cudaStream_t stream);

}  // namespace m3::native
