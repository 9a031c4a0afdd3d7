// rms_norm launcher: one 256-thread block per row.
#include "kernels/rmsnorm.cuh"
#include "native/cuda_check.h"
#include "native/norm.h"

namespace m3::native {

namespace {
constexpr int kNormThreads = 256;
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(kernels::RmsNormParams p) {
  __shared__ float smem[kNormThreads / 32];
  kernels::rmsnorm_work<kNormThreads>(p, blockIdx.x, threadIdx.x, smem);
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
  rmsnorm_kernel<<<unsigned(a.M), kNormThreads, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
