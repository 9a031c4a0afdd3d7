// FP8 row-scaled and MXFP4 quantizers (see quantize.h for the formats).
#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/codecs.h"

namespace m3 {

namespace {

// Largest magnitude of x[0, n); rejects NaN and infinities (naming the column).
float finite_amax(const float* x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    M3_CHECK(std::isfinite(a), "non-finite weight {} at column {}", x[i], i);
    amax = std::max(amax, a);
  }
  return amax;
}

}  // namespace

float quantize_fp8_row(const float* x, int64_t n, uint8_t* codes) {
  const int64_t ld = fp8_row_bytes(n);
  std::memset(codes + n, 0, size_t(ld - n));
  const float amax = finite_amax(x, n);
  if (amax == 0) {
    std::memset(codes, 0, size_t(n));
    return 1.0f;
  }
  const float scale = amax / kE4M3Max;
  for (int64_t i = 0; i < n; ++i) codes[i] = f32_to_e4m3(x[i] / scale);
  return scale;
}

void dequantize_fp8_row(const uint8_t* codes, float scale, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(codes[i]) * scale;
}

uint8_t mxfp4_scale_byte(float amax) {
  if (!(amax > 0)) return uint8_t(kE8M0Bias);  // all-zero block: scale 1
  int e2;
  std::frexp(amax, &e2);  // amax = m * 2^e2, m in [0.5, 1): floor(log2(amax)) = e2 - 1
  int shared = (e2 - 1) - kE2M1MaxExponent;
  shared = std::clamp(shared, -kE8M0Bias, kE8M0Bias);
  return uint8_t(shared + kE8M0Bias);
}

void quantize_mxfp4_row(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  const int64_t nb = mxfp4_row_blocks(n);
  std::memset(packed, 0, size_t(mxfp4_row_bytes(n)));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * kMxBlock, len = std::min<int64_t>(kMxBlock, n - c0);
    float amax;
    try {
      amax = finite_amax(x + c0, len);
    } catch (const Error&) {  // re-find the bad element to name its column in the whole row
      finite_amax(x, n);
      throw;
    }
    const uint8_t s = mxfp4_scale_byte(amax);
    scales[b] = s;
    const int shift = kE8M0Bias - int(s);  // x / 2^(s - 127), exact (a power of two)
    for (int64_t i = 0; i < len; ++i) {
      uint8_t code = f32_to_e2m1(std::ldexp(x[c0 + i], shift));
      const int64_t e = c0 + i;
      packed[e >> 1] |= (e & 1) ? uint8_t(code << 4) : code;
    }
  }
}

void dequantize_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint8_t b = packed[i >> 1];
    uint8_t nib = (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xf);
    out[i] = e2m1_to_f32(nib) * e8m0_to_f32(scales[i / kMxBlock]);
  }
}

void quantize_mxfp8_row(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  constexpr int kE4M3MaxExponent = 8;  // 448 = 1.75 * 2^8
  for (int64_t b = 0; b < mxfp4_row_blocks(n); ++b) {
    const int64_t c0 = b * kMxBlock, len = std::min<int64_t>(kMxBlock, n - c0);
    const float amax = finite_amax(x + c0, len);
    int shared = 0;
    if (amax > 0) {
      int e2;
      std::frexp(amax, &e2);
      shared = std::clamp((e2 - 1) - kE4M3MaxExponent, -kE8M0Bias, kE8M0Bias);
    }
    scales[b] = uint8_t(shared + kE8M0Bias);
    for (int64_t i = 0; i < len; ++i) codes[c0 + i] = f32_to_e4m3(std::ldexp(x[c0 + i], -shared));
  }
}

void dequantize_mxfp8_row(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(codes[i]) * e8m0_to_f32(scales[i / kMxBlock]);
}

Fp8MatrixHost quantize_fp8(const Mat& w) {
  Fp8MatrixHost q;
  q.rows = w.rows;
  q.cols = w.cols;
  q.ld = fp8_row_bytes(w.cols);
  q.codes.resize(size_t(q.rows) * size_t(q.ld));
  q.scales.resize(size_t(q.rows));
  for (int r = 0; r < w.rows; ++r) {
    try {
      q.scales[size_t(r)] = quantize_fp8_row(w.row(r), w.cols, q.codes.data() + size_t(r) * size_t(q.ld));
    } catch (const Error& e) {
      M3_FAIL("quantize_fp8 [{}, {}]: row {}: {}", w.rows, w.cols, r, e.what());
    }
  }
  return q;
}

Mat dequantize(const Fp8MatrixHost& q) {
  Mat w(q.rows, q.cols);
  for (int r = 0; r < q.rows; ++r)
    dequantize_fp8_row(q.codes.data() + size_t(r) * size_t(q.ld), q.scales[size_t(r)], q.cols, w.row(r));
  return w;
}

Mxfp4MatrixHost quantize_mxfp4(const Mat& w) {
  Mxfp4MatrixHost q;
  q.rows = w.rows;
  q.cols = w.cols;
  q.ld = mxfp4_row_bytes(w.cols);
  q.sld = mxfp4_row_blocks(w.cols);
  q.codes.resize(size_t(q.rows) * size_t(q.ld));
  q.scales.resize(size_t(q.rows) * size_t(q.sld));
  for (int r = 0; r < w.rows; ++r) {
    try {
      quantize_mxfp4_row(w.row(r), w.cols, q.codes.data() + size_t(r) * size_t(q.ld),
                         q.scales.data() + size_t(r) * size_t(q.sld));
    } catch (const Error& e) {
      M3_FAIL("quantize_mxfp4 [{}, {}]: row {}: {}", w.rows, w.cols, r, e.what());
    }
  }
  return q;
}

Mat dequantize(const Mxfp4MatrixHost& q) {
  Mat w(q.rows, q.cols);
  for (int r = 0; r < q.rows; ++r)
    dequantize_mxfp4_row(q.codes.data() + size_t(r) * size_t(q.ld), q.scales.data() + size_t(r) * size_t(q.sld),
                         q.cols, w.row(r));
  return w;
}

}  // namespace m3
