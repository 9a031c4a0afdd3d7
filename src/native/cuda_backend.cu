// Small launchers of the native forward (native/cuda_backend.cpp) that need device code of their
// own: the output-row gather (kernels/gather_rows.cuh).
#include "kernels/gather_rows.cuh"
#include "native/cuda_backend_ops.h"
#include "native/cuda_check.h"

namespace m3::native {

namespace {
constexpr int kGatherThreads = 256;
__global__ void __launch_bounds__(kGatherThreads) gather_rows_kernel(kernels::GatherRowsParams p) {
  kernels::gather_rows_work(p, int(blockIdx.x), int(threadIdx.x), kGatherThreads);
}
}  // namespace

void gather_rows(const float* in, int64_t ld_in, const int32_t* rows, int R, int n, float* out, int64_t ld_out,
                 cudaStream_t stream) {
  M3_CHECK(in && rows && out && R >= 0 && n > 0 && n % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0,
           "gather_rows: bad arguments (R {}, n {}, ld {} / {})", R, n, ld_in, ld_out);
  if (R == 0) return;
  kernels::GatherRowsParams p{in, ld_in, rows, out, ld_out, n};
  gather_rows_kernel<<<unsigned(R), kGatherThreads, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
