// Elementwise decode of a stored dtype to fp32 (kernels/dequant.cuh): items of 256 threads stride
// over the elements (at most 65535 items).
#include <algorithm>

#include "kernels/dequant.cuh"
#include "native/cuda_check.h"
#include "native/dequant.h"
#include "native/launch.cuh"

namespace m3::native {
namespace {

template <DType T>
void launch_dequant(const void* in, float* out, size_t n, cudaStream_t s) {
  const int64_t items = std::min<int64_t>(int64_t((n + kernels::kDequantThreads - 1) / kernels::kDequantThreads), 65535);
  if (items == 0) return;
  const kernels::DequantParams p{in, out, n, items};
  launch_op<kernels::DequantOp<T>>(p, kernels::WorkShape{items, kernels::kDequantThreads, 0}, s, "dequantize");
}

}  // namespace

void dequantize(DType t, const void* in, float* out, size_t n, cudaStream_t stream) {
  switch (t) {
    case DType::BF16: return launch_dequant<DType::BF16>(in, out, n, stream);
    case DType::F16: return launch_dequant<DType::F16>(in, out, n, stream);
    case DType::F32: return launch_dequant<DType::F32>(in, out, n, stream);
    case DType::F8_E4M3: return launch_dequant<DType::F8_E4M3>(in, out, n, stream);
    case DType::E8M0: return launch_dequant<DType::E8M0>(in, out, n, stream);
    case DType::E2M1x2:
      M3_CHECK(n % 2 == 0, "dequantize: E2M1x2 needs an even element count, got {}", n);
      return launch_dequant<DType::E2M1x2>(in, out, n, stream);
    default: M3_FAIL("dequantize: unsupported dtype {}", dtype_name(t));
  }
}

}  // namespace m3::native
