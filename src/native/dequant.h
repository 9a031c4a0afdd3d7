// Device-side decoding of stored element types to fp32 (the same codecs as the host, core/codecs.h).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"

namespace m3::native {

// out[i] = decode(in[i]) for i < n elements. `in` holds n elements of `t` (E2M1x2: n/2 bytes, n even).
// Supported: BF16, F16, F32, F8_E4M3, E2M1x2, E8M0. Device pointers; asynchronous on `stream`.
void dequantize(DType t, const void* in, float* out, size_t n, cudaStream_t stream);

}  // namespace m3::native
