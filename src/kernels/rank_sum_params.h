// Params and work shape of the rank sum (kernels/rank_sum.cuh).
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

struct RankSumParams {
  const float* parts = nullptr;  // [ranks][stride]: rank r's partial values at parts + r * stride
  int64_t stride = 0;            // floats between two ranks' parts (a multiple of 4)
  int ranks = 0;
  float* out = nullptr;          // [n]
  int64_t n = 0;                 // elements (a multiple of 4)
};

constexpr int kRankSumThreads = 256;
// Work item = 256 float4 of the output.
M3_HOST_DEVICE inline WorkShape rank_sum_shape(const RankSumParams& p) {
  return {ceil_div(p.n / 4, kRankSumThreads), kRankSumThreads, 0};
}

}  // namespace m3::kernels
