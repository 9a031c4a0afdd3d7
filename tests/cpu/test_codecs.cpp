// Codecs against their definitions: exhaustive decode of every code point, round trips, and
// round-to-nearest-even / saturation of the encoders checked against a brute-force nearest search.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/codecs.h"
#include "core/dtype.h"

using namespace m3;

namespace {
// Brute force: nearest representable value among all finite codes, ties to the even code.
template <class Dec>
int nearest_code(float x, int ncodes, Dec dec) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < ncodes; ++c) {
    float v = dec(c);
    if (!std::isfinite(v)) continue;
    double d = std::fabs(double(v) - double(x));
    if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) { bd = d; best = c; }
  }
  return best;
}
}  // namespace

TEST(Codecs, E4M3DecodeTable) {
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) continue;
    uint8_t back = f32_to_e4m3(v);
    // +0 and -0 both decode to zero; everything else round-trips exactly
    if (v == 0) EXPECT_EQ(e4m3_to_f32(back), 0.0f);
    else EXPECT_EQ(back, c) << "code " << c;
  }
}

TEST(Codecs, E4M3EncodeMatchesNearest) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(-12.f, 9.5f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(mag(rng)) * ((rng() & 1) ? -1.f : 1.f);
    uint8_t got = f32_to_e4m3(x);
    float ax = std::fabs(x);
    int want = nearest_code(ax, 128, [](int c) { return e4m3_to_f32(uint8_t(c)); });
    if (ax >= 464.f) want = 0x7e;  // saturating encoder
    ASSERT_EQ(got & 0x7f, want) << "x=" << x;
    ASSERT_EQ(got & 0x80, x < 0 ? 0x80 : 0) << "x=" << x;
  }
  // exact ties go to even
  EXPECT_EQ(f32_to_e4m3(1.0f + 1.0f / 16), 0x38);  // between 1.0 (0x38) and 1.125 (0x39)
  EXPECT_EQ(f32_to_e4m3(1.0f + 3.0f / 16), 0x3a);
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7f, 0x7f);
}

TEST(Codecs, E2M1AllCodesAndNearest) {
  const float vals[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_f32(uint8_t(c)), (c & 8 ? -1 : 1) * vals[c & 7]);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-7.f, 7.f);
  for (int i = 0; i < 100000; ++i) {
    float x = u(rng);
    int want = nearest_code(std::fabs(x), 8, [](int c) { return e2m1_to_f32(uint8_t(c)); });
    uint8_t got = f32_to_e2m1(x);
    ASSERT_EQ(got & 7, want) << x;
  }
  // every midpoint is a tie resolved to the even code
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(100.f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.f), 15);
}

TEST(Codecs, Bf16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float v = bf16_to_f32(uint16_t(h));
    if (std::isnan(v)) { EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v)))); continue; }
    EXPECT_EQ(f32_to_bf16(v), h);
  }
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.f, 10.f);
  for (int i = 0; i < 100000; ++i) {
    float x = n(rng);
    uint16_t b = f32_to_bf16(x);
    double got = bf16_to_f32(b);
    // the codes next to b in value order (across zero: +0's lower neighbour is the smallest
    // negative subnormal, not b - 1 = 0xffff, a NaN; the normal draw does return 0 exactly at times)
    const bool neg = (b & 0x8000) != 0, zero = (b & 0x7fff) == 0;
    const uint16_t down = neg ? uint16_t(b + 1) : zero ? uint16_t(0x8001) : uint16_t(b - 1);
    const uint16_t up = neg ? (zero ? uint16_t(0x0001) : uint16_t(b - 1)) : uint16_t(b + 1);
    double lo = bf16_to_f32(down), hi = bf16_to_f32(up);
    ASSERT_LE(std::fabs(got - x), std::fabs(lo - x)) << x;
    ASSERT_LE(std::fabs(got - x), std::fabs(hi - x)) << x;
  }
}

TEST(Codecs, F16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float v = f16_to_f32(uint16_t(h));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_f16(v), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(-26.f, 16.f);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(mag(rng));
    int want = nearest_code(x, 0x7c00, [](int c) { return f16_to_f32(uint16_t(c)); });
    if (x >= 65520.f) continue;
    ASSERT_EQ(f32_to_f16(x), want) << x;
  }
}

TEST(Codecs, E8M0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(1), std::ldexp(1.0f, -126));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, NamesRoundTrip) {
  for (auto n : {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "U8", "I8", "I16", "I32", "I64", "BOOL"}) {
    auto t = dtype_from_name(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_EQ(dtype_name(*t), n);
  }
  EXPECT_FALSE(dtype_from_name("F4").has_value());
  EXPECT_FALSE(dtype_from_name("E2M1x2").has_value());  // internal formats never come from a file
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}
