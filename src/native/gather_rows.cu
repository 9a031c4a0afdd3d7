// Row gather launcher: one 256-thread item per output row.
#include "kernels/gather_rows.cuh"
#include "native/cuda_check.h"
#include "native/gather_rows.h"
#include "native/launch.cuh"

namespace m3::native {

kernels::GatherRowsParams make_gather_rows_params(const float* in, int64_t ld_in, const int32_t* rows, int R, int n,
                                                  float* out, int64_t ld_out) {
  M3_CHECK(in && out && R >= 0 && n > 0 && n % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0,
           "gather_rows: bad arguments (R {}, n {}, ld {} / {})", R, n, ld_in, ld_out);
  return kernels::GatherRowsParams{in, ld_in, rows, out, ld_out, n, R};
}

void launch(const kernels::GatherRowsParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::GatherRowsOp>(p, kernels::gather_rows_shape(p), stream, "gather_rows", opt);
}

}  // namespace m3::native
