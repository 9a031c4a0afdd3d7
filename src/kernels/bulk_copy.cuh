// Bulk global -> shared copies by the copy engine (cp.async.bulk, sm_90) with completion on a
// shared-memory mbarrier: the weight-staging building block (mma_linear.cuh's staged tiles, the
// mono kernel's loads issued while its consumers wait for their inputs).
//   arm:   one thread calls mbar_expect_tx(bar, total bytes), then bulk_g2s(...) for copies adding
//          up to that total (16-byte aligned addresses, sizes multiples of 16);
//   wait:  every reader calls mbar_wait(bar, parity), where parity is the barrier's phase count
//          modulo 2 (the first completion of a freshly initialized barrier is parity 0);
//   reuse: re-arm only after every reader of the previous contents is past a barrier with the
//          thread that arms (the copies then cannot overtake the reads).
// mbar_init once per barrier (count 1: the arming thread's arrive), then mbar_init_fence() and a
// CTA barrier before any use.
#pragma once
#include <cstdint>

namespace m3::kernels {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes initialized barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Orders this thread's earlier generic-proxy accesses of shared memory before its later bulk copies.
__device__ __forceinline__ void proxy_fence_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The arming thread's arrive, announcing `bytes` of copies that complete this phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst,
// completing on bar.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Before the barrier's memory is used for anything else (no operation may be pending on it).
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace m3::kernels
