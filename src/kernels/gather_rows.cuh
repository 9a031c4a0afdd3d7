// Row gather: out[r, :] = in[rows[r], :] for r < R, fp32 rows of n elements (16-byte aligned rows,
// n a multiple of 4: one float4 per thread step). The native forward uses it to pick the rows that
// return logits (the last token of each sequence) before the final lm_head.
#pragma once
#include <cstdint>

namespace m3::kernels {

struct GatherRowsParams {
  const float* in = nullptr;  // [*, ld_in]
  int64_t ld_in = 0;
  const int32_t* rows = nullptr;  // [R] source row of each output row
  float* out = nullptr;       // [R, ld_out]
  int64_t ld_out = 0;
  int n = 0;                  // elements per row (multiple of 4)
};

// Work item = output row r; nthreads threads stride over it.
__device__ __forceinline__ void gather_rows_work(const GatherRowsParams& p, int r, int tid, int nthreads) {
  const float4* src = reinterpret_cast<const float4*>(p.in + int64_t(p.rows[r]) * p.ld_in);
  float4* dst = reinterpret_cast<float4*>(p.out + int64_t(r) * p.ld_out);
  for (int i = tid; i < p.n / 4; i += nthreads) dst[i] = src[i];
}

}  // namespace m3::kernels
