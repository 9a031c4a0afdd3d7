// Embedding gather (kernels/embedding.cuh): rows of the BF16 table for M token ids, to fp32 and/or
// bf16. Ids outside [0, V) give NaN rows (no out-of-bounds reads).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::native {

struct EmbedArgs {
  const uint16_t* table = nullptr;  // [V][ld] bf16
  int64_t ld = 0;                   // elements
  int V = 0, H = 0, M = 0;
  const int32_t* ids = nullptr;     // [M] device
  float* out = nullptr;             // optional [M][ld_out]
  int64_t ld_out = 0;
  uint16_t* out_bf16 = nullptr;     // optional [M][ld_ob]
  int64_t ld_ob = 0;
};
void embed(const EmbedArgs& a, cudaStream_t stream);

}  // namespace m3::native
