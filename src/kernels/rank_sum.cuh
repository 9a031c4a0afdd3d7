// The tensor-parallel ranks' partial sums added in rank order: out[i] = ((p0[i] + p1[i]) + p2[i]) + ...
// (fp32 adds, left to right), the same order as the CPU reference's all-reduce
// (runtime/communicator.h). Elementwise, so an element's bits depend only on its own partials: never
// on n, on how the gather was cut, or on the batch. parts: the all-gathered partials
// (native/collective.h). float4 per thread.
#pragma once
#include <cstdint>

#include "kernels/rank_sum_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

__device__ __forceinline__ void rank_sum_work(const RankSumParams& p, int64_t item, Group g) {
  const int64_t i = item * kRankSumThreads + g.tid;
  if (i >= p.n / 4) return;
  float4 s = reinterpret_cast<const float4*>(p.parts)[i];
  for (int r = 1; r < p.ranks; ++r) {
    const float4 v = reinterpret_cast<const float4*>(p.parts + r * p.stride)[i];
    s.x = __fadd_rn(s.x, v.x);
    s.y = __fadd_rn(s.y, v.y);
    s.z = __fadd_rn(s.z, v.z);
    s.w = __fadd_rn(s.w, v.w);
  }
  reinterpret_cast<float4*>(p.out)[i] = s;
}

struct RankSumOp : OpBounds<kRankSumThreads> {
  using Params = RankSumParams;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t*) { rank_sum_work(p, item, g); }
};

}  // namespace m3::kernels
