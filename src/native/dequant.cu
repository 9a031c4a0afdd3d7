// Elementwise decode of a stored dtype to fp32, one thread per element (per byte for E2M1x2).
// Layout: contiguous elements; E2M1x2 packs element 2i in the low nibble of byte i, 2i+1 in the high.
#include "core/codecs.h"
#include "native/cuda_check.h"
#include "native/dequant.h"

namespace m3::native {
namespace {

template <DType T>
__device__ float decode_one(const void* in, size_t i) {
  if constexpr (T == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(in)[i]);
  else if constexpr (T == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(in)[i]);
  else if constexpr (T == DType::F32) return static_cast<const float*>(in)[i];
  else if constexpr (T == DType::F8_E4M3) return e4m3_to_f32(static_cast<const uint8_t*>(in)[i]);
  else if constexpr (T == DType::E8M0) return e8m0_to_f32(static_cast<const uint8_t*>(in)[i]);
  else {
    uint8_t b = static_cast<const uint8_t*>(in)[i >> 1];
    return e2m1_to_f32((i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf));
  }
}

template <DType T>
__global__ void dequantize_kernel(const void* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = decode_one<T>(in, i);
}

template <DType T>
void launch(const void* in, float* out, size_t n, cudaStream_t s) {
  const int threads = 256;
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  if (blocks == 0) return;
  dequantize_kernel<T><<<unsigned(blocks), threads, 0, s>>>(in, out, n);
  M3_LAUNCH_CHECK(s);
}

}  // namespace

void dequantize(DType t, const void* in, float* out, size_t n, cudaStream_t stream) {
  switch (t) {
    case DType::BF16: return launch<DType::BF16>(in, out, n, stream);
    case DType::F16: return launch<DType::F16>(in, out, n, stream);
    case DType::F32: return launch<DType::F32>(in, out, n, stream);
    case DType::F8_E4M3: return launch<DType::F8_E4M3>(in, out, n, stream);
    case DType::E8M0: return launch<DType::E8M0>(in, out, n, stream);
    case DType::E2M1x2:
      M3_CHECK(n % 2 == 0, "dequantize: E2M1x2 needs an even element count, got {}", n);
      return launch<DType::E2M1x2>(in, out, n, stream);
    default: M3_FAIL("dequantize: unsupported dtype {}", dtype_name(t));
  }
}

}  // namespace m3::native
