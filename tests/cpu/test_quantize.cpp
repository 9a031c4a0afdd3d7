// Quantizers of the prepared formats (model/quantize.h): round-trip error bounds derived from the
// formats, exact byte layouts on hand-made rows, all-zero rows/blocks, padding, exponent clamping
// and the rejection of non-finite weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "common/compare.h"
#include "core/check.h"
#include "core/codecs.h"
#include "model/quantize.h"

using namespace m3;

namespace {

uint32_t fresh_seed() { return std::random_device{}(); }

// A row whose magnitudes span many binades (so both normal and subnormal e4m3 codes occur) at a
// random overall scale; a few exact zeros too.
std::vector<float> wide_row(std::mt19937& rng, int n) {
  std::uniform_real_distribution<float> lg(-12.f, 0.f), base(-30.f, 30.f);
  std::normal_distribution<float> nd;
  float s = std::exp2(base(rng));
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    uint32_t k = rng() % 16;
    v = k == 0 ? 0.f : (k < 8 ? nd(rng) * s : std::exp2(lg(rng)) * s * ((rng() & 1) ? -1.f : 1.f));
  }
  return x;
}

// Half an e4m3 ulp at magnitude |y| (y in units of the row scale): 2^(e-4) for normal y in
// [2^e, 2^(e+1)), 2^-10 on the subnormal grid (below 2^-6, spacing 2^-9).
double e4m3_half_ulp(double y) {
  y = std::fabs(y);
  if (y < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  int e = std::ilogb(y);
  return std::ldexp(1.0, e - 4);
}

// Largest |y - e2m1(y)| for |y| (in units of the block scale): half the grid spacing below 6
// (0.25 / 0.5 / 1 on [0,2) / [2,4) / [4,6]), and |y| - 6 above (saturation).
double e2m1_bound(double y) {
  y = std::fabs(y);
  if (y < 2) return 0.25;
  if (y < 4) return 0.5;
  if (y <= 6) return 1.0;
  return y - 6;
}

}  // namespace

TEST(Quantize, Fp8RoundTripWithinHalfUlp) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int rep = 0; rep < 200; ++rep) {
    const int n = 1 + int(rng() % 400);
    std::vector<float> x = wide_row(rng, n);
    std::vector<uint8_t> codes(size_t(fp8_row_bytes(n)), 0xAB);  // poison incl. the padding
    std::vector<float> back(size_t(n), NAN);
    float scale = quantize_fp8_row(x.data(), n, codes.data());
    dequantize_fp8_row(codes.data(), scale, n, back.data());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    if (amax == 0) {
      EXPECT_EQ(scale, 1.0f);
    } else {
      EXPECT_EQ(scale, amax / 448.0f);
    }
    for (int i = n; i < int(codes.size()); ++i) ASSERT_EQ(codes[size_t(i)], 0) << "padding byte " << i;
    for (int i = 0; i < n; ++i) {
      ASSERT_NE(codes[size_t(i)] & 0x7f, 0x7f) << "NaN code at " << i;
      double y = double(x[size_t(i)]) / scale;
      // the bound of the format, plus fp32 rounding of x/scale and of code*scale (2^-23 each)
      double bound = (e4m3_half_ulp(y) + std::fabs(y) * 0x1p-22) * scale;
      double err = std::fabs(double(back[size_t(i)]) - double(x[size_t(i)]));
      ASSERT_LE(err, bound) << "row " << rep << " col " << i << " x=" << x[size_t(i)] << " back=" << back[size_t(i)]
                            << " scale=" << scale;
    }
  }
}

TEST(Quantize, Fp8ExactLayout) {
  // amax 448 -> scale 1: codes are plain e4m3 encodings
  const float x[5] = {448.f, -1.f, 0.5f, 0.f, -0.001953125f /* 2^-9, smallest subnormal */};
  uint8_t codes[16];
  std::memset(codes, 0xEE, sizeof codes);
  float s = quantize_fp8_row(x, 5, codes);
  EXPECT_EQ(s, 1.0f);
  const uint8_t want[16] = {0x7e, 0xb8, 0x30, 0x00, 0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], want[i]) << "byte " << i;
  // amax 896 -> scale 2: 896 -> 448 (0x7e), 3 -> 1.5 (0x3c), -2 -> -1 (0xb8)
  const float y[3] = {3.f, 896.f, -2.f};
  s = quantize_fp8_row(y, 3, codes);
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(codes[0], 0x3c);
  EXPECT_EQ(codes[1], 0x7e);
  EXPECT_EQ(codes[2], 0xb8);
  EXPECT_EQ(fp8_row_bytes(1), 16);
  EXPECT_EQ(fp8_row_bytes(16), 16);
  EXPECT_EQ(fp8_row_bytes(6144), 6144);
  EXPECT_EQ(fp8_row_bytes(333), 336);
}

TEST(Quantize, Fp8AllZeroRow) {
  std::vector<float> x(37, 0.f);
  x[3] = -0.f;
  std::vector<uint8_t> codes(48, 0x55);
  float s = quantize_fp8_row(x.data(), 37, codes.data());
  EXPECT_EQ(s, 1.0f);
  for (uint8_t c : codes) EXPECT_EQ(c & 0x7f, 0);
  std::vector<float> back(37, NAN);
  dequantize_fp8_row(codes.data(), s, 37, back.data());
  for (float v : back) EXPECT_EQ(v, 0.f);
}

TEST(Quantize, NonFiniteRejected) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x(70, 1.f);
    x[45] = bad;
    std::vector<uint8_t> codes(80), packed(48), scales(3);
    try {
      quantize_fp8_row(x.data(), 70, codes.data());
      ADD_FAILURE() << "fp8 accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("column 45"), std::string::npos) << e.what();
    }
    try {
      quantize_mxfp4_row(x.data(), 70, packed.data(), scales.data());
      ADD_FAILURE() << "mxfp4 accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("column 45"), std::string::npos) << e.what();
    }
    Mat w(3, 70);
    for (auto& v : w.data) v = 0.5f;
    w.row(2)[45] = bad;
    try {
      quantize_mxfp4(w);
      ADD_FAILURE() << "matrix accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
    }
  }
}

TEST(Quantize, Mxfp4ScaleByte) {
  EXPECT_EQ(mxfp4_scale_byte(6.f), 127);           // floor(log2 6) = 2 -> 2^0
  EXPECT_EQ(mxfp4_scale_byte(4.f), 127);
  EXPECT_EQ(mxfp4_scale_byte(3.99f), 126);
  EXPECT_EQ(mxfp4_scale_byte(8.f), 128);
  EXPECT_EQ(mxfp4_scale_byte(1.f), 125);
  EXPECT_EQ(mxfp4_scale_byte(0.f), 127);           // all-zero block
  EXPECT_EQ(mxfp4_scale_byte(3.0e38f), 127 + 125);  // floor(log2) = 127 -> 2^125
  EXPECT_EQ(mxfp4_scale_byte(1e-40f), 0);          // clamped at 2^-127
  EXPECT_EQ(mxfp4_scale_byte(std::ldexp(1.f, -125)), 0);
  EXPECT_EQ(mxfp4_scale_byte(std::ldexp(1.f, -124)), 1);
}

TEST(Quantize, Mxfp4RoundTripBound) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int rep = 0; rep < 200; ++rep) {
    const int n = 1 + int(rng() % 300);
    std::vector<float> x = wide_row(rng, n);
    const int64_t nb = mxfp4_row_blocks(n);
    std::vector<uint8_t> packed(size_t(mxfp4_row_bytes(n)), 0xCD), scales(size_t(nb), 0xCD);
    std::vector<float> back(size_t(n), NAN);
    quantize_mxfp4_row(x.data(), n, packed.data(), scales.data());
    dequantize_mxfp4_row(packed.data(), scales.data(), n, back.data());
    // padding nibbles past n are zero codes
    for (int64_t e = n; e < nb * 32; ++e) {
      uint8_t nib = (e & 1) ? packed[size_t(e >> 1)] >> 4 : packed[size_t(e >> 1)] & 0xf;
      ASSERT_EQ(nib, 0) << "padding element " << e;
    }
    for (int64_t b = 0; b < nb; ++b) {
      int64_t c0 = b * 32, len = std::min<int64_t>(32, n - c0);
      double amax = 0;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(double(x[size_t(c0 + i)])));
      int want = amax == 0 ? 127 : std::clamp(int(std::floor(std::log2(amax))) - 2, -127, 127) + 127;
      ASSERT_EQ(scales[size_t(b)], want) << "block " << b << " amax " << amax;
      const double sc = std::ldexp(1.0, int(scales[size_t(b)]) - 127);
      for (int64_t i = 0; i < len; ++i) {
        double xi = x[size_t(c0 + i)];
        double err = std::fabs(double(back[size_t(c0 + i)]) - xi);
        ASSERT_LE(err, e2m1_bound(xi / sc) * sc) << "block " << b << " elem " << i << " x=" << xi;
        // per block: no element is off by more than 2 block-scale units (saturation of (6, 8))
        ASSERT_LE(err, 2 * sc);
      }
    }
  }
}

TEST(Quantize, Mxfp4ExactLayout) {
  // one block, amax 6 -> scale byte 127 (2^0): the codes are the plain E2M1 encodings
  float x[40] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.5f, -6.f, 0.25f, 0.75f};
  for (int i = 12; i < 40; ++i) x[i] = 0.f;
  x[32] = 0.75f;  // second (partial) block of 8 elements: amax 0.75 -> 2^-3; 0.75 / 0.125 = 6
  x[33] = -0.125f;  // -> -1
  uint8_t packed[32], scales[2];
  std::memset(packed, 0xEE, sizeof packed);
  quantize_mxfp4_row(x, 40, packed, scales);
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(scales[1], 127 - 3);
  // low nibble = even element
  EXPECT_EQ(packed[0], 0x10);  // 0, 0.5
  EXPECT_EQ(packed[1], 0x32);  // 1, 1.5
  EXPECT_EQ(packed[2], 0x54);  // 2, 3
  EXPECT_EQ(packed[3], 0x76);  // 4, 6
  EXPECT_EQ(packed[4], 0xF9);  // -0.5, -6
  EXPECT_EQ(packed[5], 0x20);  // 0.25 -> 0 (tie to even), 0.75 -> 1 (tie to even code 2)
  for (int i = 6; i < 16; ++i) EXPECT_EQ(packed[i], 0) << i;
  EXPECT_EQ(packed[16], 0xA7);  // 6, -1
  for (int i = 17; i < 32; ++i) EXPECT_EQ(packed[i], 0) << i;  // 8 real elements + 24 padding
  EXPECT_EQ(mxfp4_row_bytes(40), 32);
  EXPECT_EQ(mxfp4_row_blocks(6144), 192);
  EXPECT_EQ(mxfp4_row_bytes(6144), 3072);
}

TEST(Quantize, Mxfp4AllZeroAndTinyBlocks) {
  std::vector<float> x(64, 0.f);
  for (int i = 32; i < 64; ++i) x[size_t(i)] = (i & 1 ? -1e-41f : 1e-41f);  // below 2^-125: clamped exponent
  std::vector<uint8_t> packed(32, 0x77), scales(2, 0x77);
  quantize_mxfp4_row(x.data(), 64, packed.data(), scales.data());
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(scales[1], 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[size_t(i)], 0);
  std::vector<float> back(64, NAN);
  dequantize_mxfp4_row(packed.data(), scales.data(), 64, back.data());
  for (int i = 0; i < 64; ++i) EXPECT_LE(std::fabs(back[size_t(i)] - x[size_t(i)]), std::ldexp(1.0, -128)) << i;
}

TEST(Quantize, MatricesRoundTrip) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.05f);
  Mat w(57, 333);
  for (auto& v : w.data) v = nd(rng);
  Fp8MatrixHost q8 = quantize_fp8(w);
  EXPECT_EQ(q8.ld, 336);
  Mat d8 = dequantize(q8);
  // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of the value, or half a subnormal step
  std::vector<float> tol_ref(w.data.size()), got(d8.data);
  for (int r = 0; r < w.rows; ++r) {
    double s = q8.scales[size_t(r)];
    for (int c = 0; c < w.cols; ++c) {
      double bound = e4m3_half_ulp(w.row(r)[c] / s) * s;
      EXPECT_LE(std::fabs(d8.row(r)[c] - w.row(r)[c]), bound * (1 + 1e-6)) << r << "," << c;
    }
  }
  Mxfp4MatrixHost q4 = quantize_mxfp4(w);
  EXPECT_EQ(q4.ld, 176);
  EXPECT_EQ(q4.sld, 11);
  Mat d4 = dequantize(q4);
  for (int r = 0; r < w.rows; ++r)
    for (int c = 0; c < w.cols; ++c) {
      double s = std::ldexp(1.0, int(q4.scales[size_t(r) * 11 + size_t(c / 32)]) - 127);
      EXPECT_LE(std::fabs(d4.row(r)[c] - w.row(r)[c]), e2m1_bound(w.row(r)[c] / s) * s) << r << "," << c;
    }
}
