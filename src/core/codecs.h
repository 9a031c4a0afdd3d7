// Scalar codecs for every low-precision format the project stores: bf16, f16, FP8 E4M3,
// FP4 E2M1 and E8M0 scales. Host and device (the same code runs in kernels and in the CPU
// reference, so both paths dequantize identically). All encoders round to nearest even and
// saturate to the largest finite value (E4M3: 448, E2M1: 6); NaN encodes to NaN where the format
// has one (bf16, f16, e4m3) and to the largest finite value otherwise.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define M3_HD __host__ __device__ __forceinline__
#else
#define M3_HD inline
#endif

namespace m3 {

M3_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
M3_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// ---- bf16: the upper 16 bits of an IEEE float ----
M3_HD float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
M3_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}

// ---- f16: IEEE half ----
M3_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {  // subnormal or zero: man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}
M3_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f), sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);        // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);       // overflow (>= 65520) -> inf
  if (a < 0x38800000u) {                                        // below 2^-14: subnormal
    float v = bits_to_f32(a) * 16777216.0f;                     // in units of 2^-24
    // round half to even on an exact integer grid
    float r = v;
    uint32_t i = uint32_t(r);
    float frac = r - float(i);
    if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
    return uint16_t(sign | i);
  }
  uint32_t e = (a >> 23) - 112, m = a & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

// ---- FP8 E4M3 (OCP "fn": bias 7, no inf, 0x7f/0xff = NaN, max 448) ----
M3_HD float e4m3_to_f32(uint8_t b) {
  uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b >> 3) & 0xf, man = b & 0x7u;
  if (exp == 0xf && man == 0x7) return bits_to_f32(0x7fc00000u | sign);
  if (exp == 0) {
    float v = float(man) * (1.0f / 512.0f);  // man * 2^-9
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 120) << 23) | (man << 20));
}
M3_HD uint8_t f32_to_e4m3(float f) {
  uint32_t u = f32_to_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);  // NaN
  float x = bits_to_f32(a);
  if (x >= 464.0f) return uint8_t(sign | 0x7e);     // saturate (464 = midpoint 448..480)
  if (x < 0.015625f) {                               // below 2^-6: subnormal grid of 2^-9
    float v = x * 512.0f;
    uint32_t i = uint32_t(v);
    float frac = v - float(i);
    if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
    return uint8_t(sign | i);  // i == 8 rolls into the smallest normal, which is correct
  }
  uint32_t e = (a >> 23) - 120, m = a & 0x7fffffu;
  uint32_t r = (e << 3) | (m >> 20);
  uint32_t rem = m & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r > 0x7e) r = 0x7e;
  return uint8_t(sign | r);
}

// ---- FP4 E2M1: values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a sign bit (bit 3) ----
M3_HD float e2m1_to_f32(uint8_t nib) {
  constexpr float kVal[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = kVal[nib & 7u];
  return (nib & 8u) ? -v : v;
}
M3_HD uint8_t f32_to_e2m1(float f) {
  uint8_t sign = (f32_to_bits(f) >> 28) & 8u;
  float a = f < 0 ? -f : f;
  if (!(a == a)) return uint8_t(sign | 7u);  // NaN -> max finite
  // midpoints between grid points; ties go to the even code (code with low bit 0)
  uint8_t c;
  if (a < 0.25f) c = 0;
  else if (a == 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a == 0.75f) c = 2;
  else if (a < 1.25f) c = 2;
  else if (a == 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a == 1.75f) c = 4;
  else if (a < 2.5f) c = 4;
  else if (a == 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a == 3.5f) c = 6;
  else if (a < 5.0f) c = 6;
  else if (a == 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

// ---- E8M0: 2^(b - 127); 0xff is NaN ----
M3_HD float e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return bits_to_f32(0x7fc00000u);
  if (b == 0) return bits_to_f32(0x00400000u);  // 2^-127 (subnormal)
  return bits_to_f32(uint32_t(b) << 23);
}

}  // namespace m3
