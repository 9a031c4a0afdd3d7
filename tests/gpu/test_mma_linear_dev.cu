// Device helpers of the tensor-core linear tests: the E4M3 -> bf16 decode of kernels/mma_linear.cuh
// on given words, and a plain cold read for the bench sweep (capturable on any stream).
#include "kernels/mma_linear.cuh"
#include "native/cuda_check.h"
#include "test_mma_linear_dev.h"

namespace m3::test {

namespace {
__global__ void decode_kernel(const uint32_t* words, int n, uint32_t* out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t lo, hi;
    kernels::mma::e4m3x4_to_bf16x2(words[i], lo, hi);
    out[2 * i] = lo;
    out[2 * i + 1] = hi;
  }
}
__global__ void read_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 v0 = kernels::wstream::ld_stream(p + i), v1 = kernels::wstream::ld_stream(p + i + stride),
                v2 = kernels::wstream::ld_stream(p + i + 2 * stride), v3 = kernels::wstream::ld_stream(p + i + 3 * stride);
    acc ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
  }
  for (; i < n16; i += stride) acc ^= kernels::wstream::ld_stream(p + i).x;
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // keeps the loads alive
}
}  // namespace

void mma_decode_e4m3_words(const uint32_t* words, int n, uint32_t* out) {
  decode_kernel<<<(n + 255) / 256, 256>>>(words, n, out);
  M3_CUDA_CHECK(cudaGetLastError());
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

void plain_read_async(const void* p, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  read_kernel<<<1056, 512, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  M3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace m3::test
