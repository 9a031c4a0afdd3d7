// Row gather: out[r, :] = in[rows[r], :] for r < R, fp32 rows of n elements (16-byte aligned rows,
// n a multiple of 4: one float4 per thread step). The native forward uses it to pick the rows that
// return logits (the last token of each sequence) before the final lm_head.
#pragma once
#include <cstdint>

#include "kernels/gather_rows_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {


// Work item = output row r; the group's threads stride over it.
__device__ __forceinline__ void gather_rows_work(const GatherRowsParams& p, int r, Group g) {
  const int tid = g.tid, nthreads = g.nthreads;
  const float4* src = reinterpret_cast<const float4*>(p.in + int64_t(p.rows[r]) * p.ld_in);
  float4* dst = reinterpret_cast<float4*>(p.out + int64_t(r) * p.ld_out);
  for (int i = tid; i < p.n / 4; i += nthreads) dst[i] = src[i];
}

struct GatherRowsOp : OpBounds<kGatherThreads> {
  using Params = GatherRowsParams;
  __device__ static void run(const Params& p, int64_t r, Group g, uint8_t*) { gather_rows_work(p, int(r), g); }
};

}  // namespace m3::kernels
