// Device helpers shared by the cache-insert, indexer and attention kernels: the two cache element
// formats (FP8 E4M3 and BF16) as traits with vector decoding, warp reductions (cp.async: cp_async.cuh).
//   CacheFp8 : one byte per element, decoded with the hardware e4m3x2 -> f16x2 conversion (exact:
//              every E4M3 value is an f16 value), then f16 -> f32 (exact). Encoded with the
//              project's codec (core/codecs.h), so host and device quantize bit-identically.
//   CacheBf16: two bytes per element, decoded by a shift, encoded round-to-nearest-even.
// Scales are applied by the callers (one fp32 scalar per layer and cache).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "core/codecs.h"
#include "kernels/cp_async.cuh"

namespace m3::kernels {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Two E4M3 bytes (low byte = first element) -> two floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t two) {
  uint32_t h2;
  asm("{cvt.rn.f16x2.e4m3x2 %0, %1;}\n" : "=r"(h2) : "h"(two));
  __half2 h = *reinterpret_cast<__half2*>(&h2);
  return __half22float2(h);
}

struct CacheFp8 {
  using Store = uint8_t;
  static constexpr int kBytes = 1;
  __device__ static Store encode(float x) { return f32_to_e4m3(x); }
  // n (even) consecutive elements from 4-byte words -> floats.
  __device__ static void decode_word(uint32_t w, float* out) {  // 4 elements
    float2 a = e4m3x2_to_float2(uint16_t(w & 0xffffu));
    float2 b = e4m3x2_to_float2(uint16_t(w >> 16));
    out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
  }
  static constexpr int kPerWord = 4;
};

struct CacheBf16 {
  using Store = uint16_t;
  static constexpr int kBytes = 2;
  __device__ static Store encode(float x) { return f32_to_bf16(x); }
  __device__ static void decode_word(uint32_t w, float* out) {  // 2 elements
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  }
  static constexpr int kPerWord = 2;
};

// Loads the raw words of N elements (N * bytes in {4, 8, 16}, address aligned to that width)
// starting at p; decode_words turns them into N floats. Split so callers can issue many loads
// before the first use.
template <class C, int N>
struct Words {
  static constexpr int kCount = N * C::kBytes / 4;
  static_assert(N * C::kBytes % 4 == 0 && kCount >= 1 && kCount <= 4, "Words: 4, 8 or 16 bytes");
  uint32_t w[kCount];
};
template <class C, int N>
__device__ __forceinline__ Words<C, N> load_words(const typename C::Store* p) {
  Words<C, N> r;
  if constexpr (Words<C, N>::kCount == 4) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    r.w[0] = v.x; r.w[1] = v.y; r.w[2] = v.z; r.w[3] = v.w;
  } else if constexpr (Words<C, N>::kCount == 2) {
    uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x; r.w[1] = v.y;
  } else {
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
  return r;
}
template <class C, int N>
__device__ __forceinline__ void decode_words(const Words<C, N>& r, float* out) {
#pragma unroll
  for (int i = 0; i < Words<C, N>::kCount; ++i) C::decode_word(r.w[i], out + i * C::kPerWord);
}
template <class C, int N>
__device__ __forceinline__ void load_decode(const typename C::Store* p, float* out) {
  decode_words<C, N>(load_words<C, N>(p), out);
}

// Decodes one element (any alignment).
template <class C>
__device__ __forceinline__ float decode_one(const typename C::Store* p) {
  if constexpr (C::kBytes == 1) return e4m3_to_f32(*p);
  else return bf16_to_f32(*p);
}

}  // namespace m3::kernels
