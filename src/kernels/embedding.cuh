// Embedding gather (m3-model.md, "Head": no scaling): out[t, :] = table[ids[t], :], BF16 table
// [V][ld] to fp32 (and/or bf16) rows. An id outside [0, V) yields a NaN row (never a read out of
// bounds), so a bad id shows up in the logits instead of corrupting memory.
#pragma once
#include <cstdint>

#include "core/codecs.h"
#include "kernels/embedding_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {


// Work item = token; the group's threads stride over the row.
__device__ __forceinline__ void embed_work(const EmbedParams& p, int t, Group g) {
  const int tid = g.tid, nthreads = g.nthreads;
  const int id = p.ids[t];
  const bool ok = id >= 0 && id < p.V;
  const uint16_t* src = p.table + int64_t(ok ? id : 0) * p.ld;
  for (int i = tid; i < p.H; i += nthreads) {
    const uint16_t b = ok ? src[i] : uint16_t(0x7fc0);  // bf16 NaN
    if (p.out) p.out[int64_t(t) * p.ld_out + i] = bf16_to_f32(b);
    if (p.out_bf16) p.out_bf16[int64_t(t) * p.ld_ob + i] = b;
  }
}

struct EmbedOp : OpBounds<kEmbedThreads> {
  using Params = EmbedParams;
  __device__ static void run(const Params& p, int64_t t, Group g, uint8_t*) { embed_work(p, int(t), g); }
};

}  // namespace m3::kernels
