// fp32 activations split once into bf16 hi / lo (ActFmt::F32Split) by the op that produces them,
// for the tensor-core decode tile (kernels/mma_linear.cuh), which otherwise splits every element it
// reads in every item (~48 of its ~150 instructions a 1 KB weight block, 2026-12-07): the same
// hi and lo (mma::split_hi_lo), so the same products and bits.
//   x = hi + lo, hi = bf16_rn(x), lo = bf16_rn(x - hi) (x - hi is exact in fp32).
// Layout: a row of n elements (n % 4 == 0, 4 bytes an element as in fp32) is n / 4 groups of 16
// bytes; group q (elements 4q .. 4q + 3) holds the bf16x2 words {hi 4q, hi 4q+1}, {hi 4q+2,
// hi 4q+3}, {lo 4q, lo 4q+1}, {lo 4q+2, lo 4q+3}: one step's B fragments (both MMAs) in one
// 16-byte load. (The MoE experts' split rows, kernels/moe_mma.cuh, pair their elements for their
// own walk.)
#pragma once
#include <cstdint>

namespace m3::kernels {

namespace mma {

// bf16x2 {lo element, hi element}, round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float e0, float e1) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(e1), "f"(e0));
  return d;
}

// x = hi + lo for a pair of fp32 values (hi = bf16(x), lo = bf16(x - hi)).
__device__ __forceinline__ void split_hi_lo(float e0, float e1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16x2(e0, e1);
  const float r0 = __fsub_rn(e0, __uint_as_float(hi << 16));
  const float r1 = __fsub_rn(e1, __uint_as_float(hi & 0xffff0000u));
  lo = pack_bf16x2(r0, r1);
}

// x = hi + mid + lo for a pair of fp32 values (hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid); both differences exact in fp32), so |x - hi - mid - lo| <= 2^-26 |x|
// for normal x: operands of an MMA that must be as exact as fp32 (kernels/attention.cuh).
__device__ __forceinline__ void split_hi_mid_lo(float e0, float e1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  split_hi_lo(e0, e1, hi, mid);
  const float r0 = __fsub_rn(__fsub_rn(e0, __uint_as_float(hi << 16)), __uint_as_float(mid << 16));
  const float r1 = __fsub_rn(__fsub_rn(e1, __uint_as_float(hi & 0xffff0000u)), __uint_as_float(mid & 0xffff0000u));
  lo = pack_bf16x2(r0, r1);
}

}  // namespace mma

// Group q of a split row from its 4 fp32 values.
__device__ __forceinline__ uint4 split_group4(float4 v) {
  uint4 r;
  mma::split_hi_lo(v.x, v.y, r.x, r.z);
  mma::split_hi_lo(v.z, v.w, r.y, r.w);
  return r;
}

// Element j of a split row (row: the row's first bf16) from its fp32 value: two 2-byte stores.
__device__ __forceinline__ void store_split_element(uint16_t* row, int j, float v) {
  const uint32_t h = mma::pack_bf16x2(v, 0.f) & 0xffffu;
  const uint32_t l = mma::pack_bf16x2(__fsub_rn(v, __uint_as_float(h << 16)), 0.f) & 0xffffu;
  uint16_t* q = row + 8 * (j >> 2) + (j & 3);
  q[0] = uint16_t(h);
  q[4] = uint16_t(l);
}

}  // namespace m3::kernels
