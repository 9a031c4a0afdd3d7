// Params and work shape of the embedding gather (kernels/embedding.cuh).
#pragma once
#include <cstdint>

#include "kernels/work.h"

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

constexpr int kEmbedThreads = 256;
// Work item = token; kEmbedThreads threads stride over the row.
M3_HOST_DEVICE inline WorkShape embed_shape(const EmbedParams& p) { return {p.M, kEmbedThreads, 0}; }

}  // namespace m3::kernels
