// Row gather: out[r, :] = in[rows[r], :] (+ add[rows[r], :]) for r < R, fp32 rows of n elements
// (16-byte aligned rows, n a multiple of 4: one float4 per thread step). The native forward uses it
// to pick the rows that return logits (the last token of each sequence) before the final lm_head;
// with `add`, the aux capture copies a residual stream before the norm op that would add it.
#pragma once
#include <cstdint>

#include "kernels/gather_rows_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {


// Work item = output row r; the group's threads stride over it.
__device__ __forceinline__ void gather_rows_work(const GatherRowsParams& p, int r, Group g) {
  const int tid = g.tid, nthreads = g.nthreads;
  const int64_t s = p.rows ? p.rows[r] : r;
  const float4* src = reinterpret_cast<const float4*>(p.in + s * p.ld_in);
  float4* dst = reinterpret_cast<float4*>(p.out + int64_t(r) * p.ld_out);
  if (!p.add) {
    for (int i = tid; i < p.n / 4; i += nthreads) dst[i] = src[i];
    return;
  }
  const float4* add = reinterpret_cast<const float4*>(p.add + s * p.ld_add);
  for (int i = tid; i < p.n / 4; i += nthreads) {
    const float4 a = src[i], b = add[i];
    dst[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}

struct GatherRowsOp : OpBounds<kGatherThreads> {
  using Params = GatherRowsParams;
  __device__ static void run(const Params& p, int64_t r, Group g, uint8_t*) { gather_rows_work(p, int(r), g); }
};

}  // namespace m3::kernels
