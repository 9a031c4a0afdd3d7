// The thread group that runs one work item (kernels/work.h). Every *_work function takes one: its
// threads are numbered 0 .. nthreads-1 (a multiple of 32; warp w = threads 32w .. 32w + 31) and
// synchronize with sync() only, never with a CTA-wide barrier, so a persistent kernel can run
// several groups side by side in one CTA. bar 0 means the group is the whole CTA (the native
// launch: sync() is the CTA barrier); any other id names a hardware barrier (1 .. 15) that exactly
// the group's nthreads threads use (bar.sync id, nthreads).
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

struct Group {
  int tid = 0;       // this thread, 0 .. nthreads - 1
  int nthreads = 0;  // threads of the group
  int bar = 0;       // 0: the whole CTA; 1 .. 15: a named barrier of nthreads threads

  __device__ __forceinline__ void sync() const {
    if (bar == 0) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(nthreads) : "memory");
  }
  __device__ __forceinline__ int lane() const { return tid & 31; }
  __device__ __forceinline__ int warp() const { return tid >> 5; }
  __device__ __forceinline__ int num_warps() const { return nthreads >> 5; }
};

// The group of the whole CTA (what the generic kernel hands every item).
__device__ __forceinline__ Group cta_group() { return Group{int(threadIdx.x), int(blockDim.x), 0}; }

}  // namespace m3::kernels
