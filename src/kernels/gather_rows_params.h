// Params and work shape of the row gather (kernels/gather_rows.cuh).
#pragma once
#include <cstdint>

#include "kernels/work.h"

namespace m3::kernels {

struct GatherRowsParams {
  const float* in = nullptr;  // [*, ld_in]
  int64_t ld_in = 0;
  const int32_t* rows = nullptr;  // [R] source row of each output row (null: row r)
  float* out = nullptr;       // [R, ld_out]
  int64_t ld_out = 0;
  int n = 0;                  // elements per row (multiple of 4)
  int R = 0;                  // output rows
  // optional [*, ld_add]: out[r] = in[src] + add[src], one fp32 add per element (an RMS norm op's
  // residual sum r = x + residual, bit for bit: the aux rows of native/aux_capture.h)
  const float* add = nullptr;
  int64_t ld_add = 0;
};

constexpr int kGatherThreads = 256;
// Work item = output row; kGatherThreads threads stride over it.
M3_HOST_DEVICE inline WorkShape gather_rows_shape(const GatherRowsParams& p) { return {p.R, kGatherThreads, 0}; }

}  // namespace m3::kernels
