// Device-side random fills for the weight-kernel tests: large MXFP4 / FP8 tensors are generated on
// the GPU (a hash of seed and index), so host time goes to the reference only.
#include <cuda_runtime.h>

#include "native/cuda_check.h"
#include "test_moe_fill.h"

namespace m3::test {

namespace {
__device__ __forceinline__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}
__global__ void fill_kernel(uint8_t* p, size_t n, uint64_t seed, int kind, int lo, int hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t r = mix(seed * 0x9e3779b97f4a7c15ull + i);
    uint8_t b = uint8_t(r);
    if (kind == 1 && (b & 0x7f) == 0x7f) b &= 0xfe;                // no NaN codes
    if (kind == 2) b = uint8_t(lo + int(r % uint32_t(hi - lo + 1)));  // E8M0 in [lo, hi]
    p[i] = b;
  }
}
__global__ void stream_read_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v0 = __ldcs(p + i), v1 = __ldcs(p + i + stride), v2 = __ldcs(p + i + 2 * stride),
          v3 = __ldcs(p + i + 3 * stride);
    acc ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
  }
  for (; i < n16; i += stride) acc ^= __ldcs(p + i).x;
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // keeps the loads alive
}
}  // namespace

void stream_read_device(const void* p, size_t bytes, uint32_t* sink) {
  stream_read_kernel<<<1056, 512>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  M3_CUDA_CHECK(cudaGetLastError());
}

void fill_random_device(uint8_t* p, size_t n, uint64_t seed, FillKind kind, int lo, int hi) {
  fill_kernel<<<1024, 256>>>(p, n, seed, int(kind), lo, hi);
  M3_CUDA_CHECK(cudaGetLastError());
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace m3::test
