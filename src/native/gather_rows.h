// Row gather (kernels/gather_rows.cuh): out[r, 0..n) = in[rows[r], 0..n) for r < R (rows: device
// array, or null for row r). n % 4 == 0, 16-byte aligned rows. The forward picks the rows that
// return logits with it; params.add (set after make) adds a second array's rows (aux_capture.cpp).
#pragma once
#include <cstdint>

#include "kernels/gather_rows_params.h"
#include "native/launch.h"

namespace m3::native {

kernels::GatherRowsParams make_gather_rows_params(const float* in, int64_t ld_in, const int32_t* rows, int R, int n,
                                                  float* out, int64_t ld_out);
void launch(const kernels::GatherRowsParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

}  // namespace m3::native
