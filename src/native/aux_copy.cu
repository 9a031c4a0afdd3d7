// copy_residual_sum (native/aux_copy.h): one 256-thread block per row.
#include "core/check.h"
#include "native/aux_copy.h"
#include "native/cuda_check.h"

namespace m3::native {

namespace {
__global__ void residual_sum_rows(const float* x, int64_t ld_x, const float* res, int64_t ld_res, int n, float* dst,
                                  int64_t ld_dst) {
  const int64_t r = blockIdx.x;
  for (int j = threadIdx.x; j < n; j += blockDim.x) dst[r * ld_dst + j] = x[r * ld_x + j] + res[r * ld_res + j];
}
}  // namespace

void copy_residual_sum(const float* x, int64_t ld_x, const float* residual, int64_t ld_res, int rows, int n, float* dst,
                       int64_t ld_dst, cudaStream_t stream) {
  M3_CHECK(x && residual && dst && rows >= 0 && n > 0, "aux copy: bad arguments (rows {}, n {})", rows, n);
  if (rows == 0) return;
  residual_sum_rows<<<rows, 256, 0, stream>>>(x, ld_x, residual, ld_res, n, dst, ld_dst);
  M3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace m3::native
