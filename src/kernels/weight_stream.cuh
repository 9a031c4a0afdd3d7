// Device helpers of the weight-streaming kernels (gemv.cuh, moe_mxfp4.cuh): 16-byte streaming
// loads of weight rows, exact decoding of one 16-byte chunk of each prepared weight format to fp32,
// activation loads (bf16 or fp32, masked past K), and a fixed-order block reduction.
//   FP8 E4M3 (16 codes per chunk): hardware e4m3x2 -> f16x2 conversion, then f16 -> f32 (both exact).
//   BF16 (8 per chunk): a shift.   F32 (4 per chunk): as is.
//   E2M1 (32 codes per chunk = one MX block; element 2i in the low nibble of byte i): each nibble is
//   placed into an f16 bit pattern (sign -> bit 15, e1 e0 m -> bits 11..9), which is the E2M1 value
//   times 2^-14 exactly (subnormal code 0.5 included); callers multiply the block's partial sum by
//   2^14 and by the block's E8M0 scale.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/codecs.h"
#include "kernels/formats.h"
#include "kernels/group.cuh"

namespace m3::kernels {

namespace wstream {

// Weight bytes are read once per pass: no L1 allocation (keeps L1 for the activations).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <WeightFmt W>
struct Chunk;  // elements per 16-byte chunk
template <>
struct Chunk<WeightFmt::FP8> { static constexpr int kElems = 16; };
template <>
struct Chunk<WeightFmt::BF16> { static constexpr int kElems = 8; };
template <>
struct Chunk<WeightFmt::F32> { static constexpr int kElems = 4; };

__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

template <WeightFmt W>
__device__ __forceinline__ void decode_chunk(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (W == WeightFmt::FP8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 a = fp8x2_to_float2(w[i]), b = fp8x2_to_float2(w[i] >> 16);
      f[4 * i] = a.x;
      f[4 * i + 1] = a.y;
      f[4 * i + 2] = b.x;
      f[4 * i + 3] = b.y;
    }
  } else if constexpr (W == WeightFmt::BF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
  }
}

// 32 E2M1 codes -> 32 floats equal to the code values times 2^-14.
__device__ __forceinline__ void decode_e2m1x32_scaled(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = w[i], b = w[i] >> 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // byte 0 <- byte k of a (low nibble: element 2k), byte 2 <- byte k of b (element 2k+1)
      const uint32_t t = __byte_perm(a, b, uint32_t(k | (k << 4) | ((4 + k) << 8) | ((4 + k) << 12)));
      const uint32_t h = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
      __half2_raw hr;
      hr.x = uint16_t(h & 0xffffu);
      hr.y = uint16_t(h >> 16);
      const float2 p = __half22float2(__half2(hr));
      f[8 * i + 2 * k] = p.x;
      f[8 * i + 2 * k + 1] = p.y;
    }
  }
}

// N activations of row `row` starting at element k0 (a multiple of N); elements at or past K read
// as 0. Rows must start 16-byte aligned (ld_x a multiple of 8 bf16 / 4 f32 elements).
template <ActFmt X, int N>
__device__ __forceinline__ void load_act(const void* x, int64_t ld_x, int row, int k0, int K, float* f) {
  if constexpr (X == ActFmt::BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(x) + int64_t(row) * ld_x + k0;
    if (k0 + N <= K) {
      if constexpr (N % 8 == 0) {
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
          uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
          const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            f[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
            f[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
          }
        }
      } else {
        static_assert(N == 4, "bf16 activation chunks of 4, 8, 16 or 32");
        uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
        f[0] = __uint_as_float(v.x << 16);
        f[1] = __uint_as_float(v.x & 0xffff0000u);
        f[2] = __uint_as_float(v.y << 16);
        f[3] = __uint_as_float(v.y & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) f[i] = k0 + i < K ? bf16_to_f32(p[i]) : 0.0f;
    }
  } else {
    const float* p = static_cast<const float*>(x) + int64_t(row) * ld_x + k0;
    if (k0 + N <= K) {
#pragma unroll
      for (int i = 0; i < N / 4; ++i) {
        float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
        f[4 * i] = v.x;
        f[4 * i + 1] = v.y;
        f[4 * i + 2] = v.z;
        f[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) f[i] = k0 + i < K ? p[i] : 0.0f;
    }
  }
}

__device__ __forceinline__ float warp_sum_xor(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sums acc[0..V) over the NT threads of group g (g.nthreads == NT) in a fixed order (warp
// butterfly, then warps in index order). After the call, smem[i] for i < V holds the sums.
// smem: (NT / 32) * V floats. Synchronizes the group: every thread of it must call it.
template <int V, int NT>
__device__ __forceinline__ void block_sum(float (&acc)[V], Group g, float* smem) {
  constexpr int kWarps = NT / 32;
  const int tid = g.tid, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float s = warp_sum_xor(acc[i]);
    if (lane == 0) smem[warp * V + i] = s;
  }
  g.sync();
  float tot = 0;
  if (tid < V) {
    tot = smem[tid];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) tot += smem[w * V + tid];
  }
  g.sync();
  if (tid < V) smem[tid] = tot;
  g.sync();
}

}  // namespace wstream
}  // namespace m3::kernels
