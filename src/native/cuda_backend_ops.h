// Launchers private to the native forward (native/cuda_backend.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::native {

// out[r, 0..n) = in[rows[r], 0..n) for r < R (rows: device array). n % 4 == 0, 16-byte aligned rows.
void gather_rows(const float* in, int64_t ld_in, const int32_t* rows, int R, int n, float* out, int64_t ld_out,
                 cudaStream_t stream);

}  // namespace m3::native
