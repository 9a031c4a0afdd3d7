// The last-arriver step of the fused decode ops (kernels/router_gemv_route.cuh, kernels/mma_rope.cuh):
// the items of an op count themselves in on a counter once their outputs are written, and the one
// that arrives last runs the small op that reads them all.
#pragma once
#include <cstdint>

#include "kernels/group.cuh"

namespace m3::kernels {

// After the group's writes (ordered by a group barrier before the call): thread 0 adds 1 to
// *arrivals (acquire-release, device scope: the writes of every item that arrived before are
// visible to the last one) and, when it brought the count to `total`, resets it to 0 for the next
// launch. Returns, to every thread of the group, whether this item arrived last. flag: one int of
// shared memory the group is not using.
__device__ __forceinline__ bool arrive_last(int32_t* arrivals, int total, Group g, int32_t* flag) {
  if (g.tid == 0) {
    int32_t prev;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(prev) : "l"(arrivals) : "memory");
    const bool last = prev == total - 1;
    // every item has arrived: nothing else touches it in this launch. A plain store: the next
    // arrivals on this counter (the next launch, or in the mono kernel the next layer's op) come
    // after this op's completion is published, which orders them after it.
    if (last) *arrivals = 0;
    *flag = last ? 1 : 0;
  }
  g.sync();
  const bool last = *flag != 0;
  g.sync();  // the flag's shared memory is the small op's
  return last;
}

}  // namespace m3::kernels
