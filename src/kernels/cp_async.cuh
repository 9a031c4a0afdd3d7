// Asynchronous global -> shared copies (cp.async, sm_80+), shared by the attention, indexer and
// MoE kernels. A copy with src_bytes < its size reads src_bytes and zero-fills the rest (0: reads
// nothing, writes zeros). Completion: cp_async_commit() closes a group; cp_async_wait<N>() returns
// once at most N of this thread's groups are pending; other threads of the warp may read the
// data after a __syncwarp() that follows their own waits.
#pragma once
#include <cstdint>

namespace m3::kernels {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
// 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace m3::kernels
