// The router GEMV and the routing in one op for decode (router_params.h RouterGemvRouteParams):
// every item computes its logits exactly as GemvOp does, then counts itself in; the last item to
// arrive runs the route (MoeRouteOp's work) over all the logits. One op and one dependency hop
// less on each MoE layer's chain (native: a launch; mono: a counter wait), the same bits.
#pragma once
#include <cstdint>

#include "kernels/arrival.cuh"
#include "kernels/gemv.cuh"
#include "kernels/router.cuh"

namespace m3::kernels {

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
