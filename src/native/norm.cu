// rms_norm launcher: one 256-thread item per row (kernels/rmsnorm.cuh).
#include "kernels/rmsnorm.cuh"
#include "native/cuda_check.h"
#include "native/launch.cuh"
#include "native/norm.h"

namespace m3::native {

namespace {
bool aligned(const void* ptr, int64_t ld, int64_t elem_bytes, int64_t bytes) {
  return !ptr || (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0 && (ld * elem_bytes) % bytes == 0);
}
}  // namespace

kernels::RmsNormParams make_rmsnorm_params(kernels::RmsNormParams p) {
  M3_CHECK(p.x && p.w && p.n > 0 && p.M > 0 && p.ld_x >= p.n, "rms_norm: bad input (n {}, M {}, ld {})", p.n, p.M,
           p.ld_x);
  M3_CHECK(p.y || p.y_bf16 || p.residual_out, "rms_norm: no output");
  M3_CHECK(!p.residual || p.ld_res >= p.n, "rms_norm: residual ld {} < n {}", p.ld_res, p.n);
  M3_CHECK(!p.residual_out || p.ld_res_out >= p.n, "rms_norm: residual_out ld {} < n {}", p.ld_res_out, p.n);
  M3_CHECK(!p.y || p.ld_y >= p.n, "rms_norm: y ld {} < n {}", p.ld_y, p.n);
  M3_CHECK(!p.y_bf16 || p.ld_yb >= p.n, "rms_norm: y_bf16 ld {} < n {}", p.ld_yb, p.n);
  M3_CHECK(!p.prep || (p.n % kernels::kNormChunk == 0 && p.y && p.inv && !p.y_bf16),
           "rms_norm: the prep half needs n % {} == 0 (n {}), y and inv, and no bf16 output", kernels::kNormChunk, p.n);
  const bool regs = p.n % 4 == 0 && p.n / 4 <= kernels::kNormThreads * kernels::kNormVec &&
                    aligned(p.x, p.ld_x, 4, 16) && aligned(p.residual, p.ld_res, 4, 16) &&
                    aligned(p.residual_out, p.ld_res_out, 4, 16) && aligned(p.y, p.ld_y, 4, 16) &&
                    aligned(p.y_bf16, p.ld_yb, 2, 8) && aligned(p.w, 0, 2, 8);
  p.regs = regs ? 1 : 0;
  return p;
}

void launch(const kernels::RmsNormParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  if (p.regs) launch_op<kernels::RmsNormOp<true>>(p, kernels::rmsnorm_shape(p), stream, "rms_norm", opt);
  else launch_op<kernels::RmsNormOp<false>>(p, kernels::rmsnorm_shape(p), stream, "rms_norm", opt);
}

void rms_norm(const kernels::RmsNormParams& p, cudaStream_t stream) { launch(make_rmsnorm_params(p), stream); }

void llama_rms_norm(kernels::RmsNormParams p, cudaStream_t stream) {
  M3_CHECK(!p.prep, "llama_rms_norm: no prep half");
  p = make_rmsnorm_params(p);
  if (p.regs) launch_op<kernels::RmsNormOp<true, false>>(p, kernels::rmsnorm_shape(p), stream, "llama_rms_norm");
  else launch_op<kernels::RmsNormOp<false, false>>(p, kernels::rmsnorm_shape(p), stream, "llama_rms_norm");
}

}  // namespace m3::native
