// rms_norm launcher: one 256-thread block per row; rows of up to 8192 aligned floats are held in
// registers (kernels/rmsnorm.cuh rmsnorm_row_regs), others take the strided loop.
#include "kernels/rmsnorm.cuh"
#include "native/cuda_check.h"
#include "native/norm.h"

namespace m3::native {

namespace {
constexpr int kNormThreads = 256;
constexpr int kNormVec = 8;  // float4s per thread in the register body: rows up to 8192 floats
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(kernels::RmsNormParams p) {
  __shared__ float smem[kNormThreads / 32];
  kernels::rmsnorm_work<kNormThreads>(p, blockIdx.x, threadIdx.x, smem);
}
__global__ void __launch_bounds__(kNormThreads) rmsnorm_regs_kernel(kernels::RmsNormParams p) {
  __shared__ float smem[kNormThreads / 32];
  kernels::rmsnorm_row_regs<kNormThreads, kNormVec>(p, blockIdx.x, threadIdx.x, smem);
}
bool aligned(const void* ptr, int64_t ld, int64_t elem_bytes, int64_t bytes) {
  return !ptr || (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0 && (ld * elem_bytes) % bytes == 0);
}
}  // namespace

void rms_norm(const RmsNormArgs& a, cudaStream_t stream) {
  M3_CHECK(a.x && a.w && a.n > 0 && a.M > 0 && a.ld_x >= a.n, "rms_norm: bad input (n {}, M {}, ld {})", a.n, a.M,
           a.ld_x);
  M3_CHECK(a.y || a.y_bf16 || a.residual_out, "rms_norm: no output");
  M3_CHECK(!a.residual || a.ld_res >= a.n, "rms_norm: residual ld {} < n {}", a.ld_res, a.n);
  M3_CHECK(!a.residual_out || a.ld_res_out >= a.n, "rms_norm: residual_out ld {} < n {}", a.ld_res_out, a.n);
  M3_CHECK(!a.y || a.ld_y >= a.n, "rms_norm: y ld {} < n {}", a.ld_y, a.n);
  M3_CHECK(!a.y_bf16 || a.ld_yb >= a.n, "rms_norm: y_bf16 ld {} < n {}", a.ld_yb, a.n);
  M3_CHECK(a.M <= 0x7fffffff, "rms_norm: too many rows");
  kernels::RmsNormParams p;
  p.x = a.x;
  p.ld_x = a.ld_x;
  p.residual = a.residual;
  p.ld_res = a.ld_res;
  p.residual_out = a.residual_out;
  p.ld_res_out = a.ld_res_out;
  p.w = a.w;
  p.y = a.y;
  p.ld_y = a.ld_y;
  p.y_bf16 = a.y_bf16;
  p.ld_yb = a.ld_yb;
  p.n = a.n;
  p.M = a.M;
  p.eps = a.eps;
  const bool regs = a.n % 4 == 0 && a.n / 4 <= kNormThreads * kNormVec && aligned(a.x, a.ld_x, 4, 16) &&
                    aligned(a.residual, a.ld_res, 4, 16) && aligned(a.residual_out, a.ld_res_out, 4, 16) &&
                    aligned(a.y, a.ld_y, 4, 16) && aligned(a.y_bf16, a.ld_yb, 2, 8) && aligned(a.w, 0, 2, 8);
  if (regs) rmsnorm_regs_kernel<<<unsigned(a.M), kNormThreads, 0, stream>>>(p);
  else rmsnorm_kernel<<<unsigned(a.M), kNormThreads, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
