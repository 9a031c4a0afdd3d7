// Embedding gather (m3-model.md, "Head": no scaling): out[t, :] = table[ids[t], :], BF16 table
// [V][ld] to fp32 (and/or bf16) rows. An id outside [0, V) yields a NaN row (never a read out of
// bounds), so a bad id shows up in the logits instead of corrupting memory.
#pragma once
#include <cstdint>

#include "core/codecs.h"

namespace m3::kernels {

struct EmbedParams {
  const uint16_t* table = nullptr;  // [V][ld] bf16
  int64_t ld = 0;                   // elements
  int V = 0, H = 0, M = 0;
  const int32_t* ids = nullptr;     // [M]
  float* out = nullptr;             // optional [M][ld_out] fp32
  int64_t ld_out = 0;
  uint16_t* out_bf16 = nullptr;     // optional [M][ld_ob] bf16
  int64_t ld_ob = 0;
};

// Work item = token; nthreads threads stride over the row.
__device__ __forceinline__ void embed_work(const EmbedParams& p, int t, int tid, int nthreads) {
  const int id = p.ids[t];
  const bool ok = id >= 0 && id < p.V;
  const uint16_t* src = p.table + int64_t(ok ? id : 0) * p.ld;
  for (int i = tid; i < p.H; i += nthreads) {
    const uint16_t b = ok ? src[i] : uint16_t(0x7fc0);  // bf16 NaN
    if (p.out) p.out[int64_t(t) * p.ld_out + i] = bf16_to_f32(b);
    if (p.out_bf16) p.out_bf16[int64_t(t) * p.ld_ob + i] = b;
  }
}

}  // namespace m3::kernels
