// Device helpers of the tensor-core linear tests (test_mma_linear_dev.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace m3::test {
// out[2i] / out[2i+1] = the bf16x2 pairs {e0, e1} / {e2, e3} that kernels/mma_linear.cuh decodes
// from the four E4M3 codes of words[i] (device pointers). Synchronous.
void mma_decode_e4m3_words(const uint32_t* words, int n, uint32_t* out);
// A plain streaming read of `bytes` (16-byte ld.global.nc.L1::no_allocate, 4 in flight per thread,
// 1056 blocks of 512) on `stream`; sink: 1056 words. Asynchronous.
void plain_read_async(const void* p, size_t bytes, uint32_t* sink, cudaStream_t stream);
}  // namespace m3::test
