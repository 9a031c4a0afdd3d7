// The router GEMV and the routing in one op for decode (router_params.h RouterGemvRouteParams):
// every item computes its logits exactly as GemvOp does, then counts itself in; the last item to
// arrive runs the route (MoeRouteOp's work) over all the logits. One op and one dependency hop
// less on each MoE layer's chain (native: a launch; mono: a counter wait), the same bits.
#pragma once
#include <cstdint>

#include "kernels/gemv.cuh"
#include "kernels/router.cuh"

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
    if (last) *arrivals = 0;  // every item has arrived: nothing else touches it in this launch
    *flag = last ? 1 : 0;
  }
  g.sync();
  const bool last = *flag != 0;
  g.sync();  // the flag's shared memory is the route's
  return last;
}

template <WeightFmt W, int MT>
struct RouterGemvRouteOp : OpBounds<kGemvThreads> {
  using Params = RouterGemvRouteParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    gemv_work<W, ActFmt::F32, MT, 1>(p.gemv, int(w), g, reinterpret_cast<float*>(smem), 0, p.gemv.M);  // ends synced
    if (arrive_last(p.arrivals, gemv_work_items(p.gemv.N, 1), g, reinterpret_cast<int32_t*>(smem)))
      MoeRouteOp::run(p.route, 0, g, smem);
  }
};

}  // namespace m3::kernels
