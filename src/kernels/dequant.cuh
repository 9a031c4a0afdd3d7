// Elementwise decode of a stored dtype to fp32 (native/dequant.h), the same codecs as the host
// (core/codecs.h). Layout: contiguous elements; E2M1x2 packs element 2i in the low nibble of byte
// i, 2i+1 in the high one. Work: `items` groups of 256 threads stride over the n elements
// (element i by thread i mod 256 of item (i / 256) mod items).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/codecs.h"
#include "core/dtype.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

constexpr int kDequantThreads = 256;

struct DequantParams {
  const void* in = nullptr;
  float* out = nullptr;
  size_t n = 0;
  int64_t items = 0;  // items of the launch (the stride is items * 256)
};

template <DType T>
__device__ __forceinline__ float dequant_one(const void* in, size_t i) {
  if constexpr (T == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(in)[i]);
  else if constexpr (T == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(in)[i]);
  else if constexpr (T == DType::F32) return static_cast<const float*>(in)[i];
  else if constexpr (T == DType::F8_E4M3) return e4m3_to_f32(static_cast<const uint8_t*>(in)[i]);
  else if constexpr (T == DType::E8M0) return e8m0_to_f32(static_cast<const uint8_t*>(in)[i]);
  else {
    const uint8_t b = static_cast<const uint8_t*>(in)[i >> 1];
    return e2m1_to_f32((i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf));
  }
}

template <DType T>
struct DequantOp : OpBounds<kDequantThreads> {
  using Params = DequantParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const size_t stride = size_t(p.items) * kDequantThreads;
    for (size_t i = size_t(w) * kDequantThreads + size_t(g.tid); i < p.n; i += stride) p.out[i] = dequant_one<T>(p.in, i);
  }
};

}  // namespace m3::kernels
