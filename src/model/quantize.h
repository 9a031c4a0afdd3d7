// CPU quantizers and dequantizers of the prepared weight formats (docs/formats.md):
//   FP8 row-scaled: one FP8 E4M3 code per weight and one fp32 scale per output row,
//                   scale = amax(row) / 448, code = e4m3(w / scale) (round to nearest even, saturating);
//   MXFP4:          E2M1 codes two per byte (low nibble = even element) with one E8M0 scale per 32
//                   inputs; the shared exponent is floor(log2(amax(block))) - 2 (OCP MX: E2M1's
//                   largest exponent is 2), clamped to E8M0's range [-127, 127].
// The same functions fill the GPU weight arena at load time and dequantize it back for the CPU
// reference, so every path sees the same numbers. Rows are padded to 16-byte multiples (zero
// codes) so kernels can read every row with 16-byte loads.
// Non-finite weights (NaN, +-inf) are rejected with an m3::Error naming the column; callers add the
// tensor and row. An all-zero row (block) stores scale 1.0 (E8M0 127) and zero codes.
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace m3 {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr int kMxBlock = 32;          // inputs per E8M0 scale
inline constexpr int kE2M1MaxExponent = 2;   // 6 = 1.5 * 2^2
inline constexpr int kE8M0Bias = 127;

// Bytes per stored row (16-byte multiples).
inline int64_t fp8_row_bytes(int64_t cols) { return (cols + 15) / 16 * 16; }
inline int64_t mxfp4_row_blocks(int64_t cols) { return (cols + kMxBlock - 1) / kMxBlock; }
inline int64_t mxfp4_row_bytes(int64_t cols) { return mxfp4_row_blocks(cols) * (kMxBlock / 2); }

// ---- one row ----
// codes: fp8_row_bytes(n) bytes (the tail past n is zeroed). Returns the row's scale.
float quantize_fp8_row(const float* x, int64_t n, uint8_t* codes);
// out[i] = e4m3(codes[i]) * scale (one fp32 multiply), i < n.
void dequantize_fp8_row(const uint8_t* codes, float scale, int64_t n, float* out);

// The E8M0 byte of a block whose largest magnitude is amax (finite, >= 0).
uint8_t mxfp4_scale_byte(float amax);
// packed: mxfp4_row_bytes(n) bytes (padding nibbles are zero codes); scales: mxfp4_row_blocks(n).
void quantize_mxfp4_row(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);
// out[i] = e2m1(nibble i) * 2^(scale - 127) (one fp32 multiply), i < n.
void dequantize_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

// MXFP8 (the official MiniMax-M3 release's linears): E4M3 codes [n] (not padded) and one E8M0
// scale per 32 inputs, the block's largest magnitude mapped below 2^9 (E4M3's top binade; values
// past 448 saturate), as the OCP MX rule picks it: 2^(floor(log2 amax) - 8).
void quantize_mxfp8_row(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);
// out[i] = e4m3(codes[i]) * 2^(scale - 127) (one fp32 multiply), i < n.
void dequantize_mxfp8_row(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);

// ---- whole matrices on the host (tests, tools) ----
struct Fp8MatrixHost {
  int rows = 0, cols = 0;
  int64_t ld = 0;                 // bytes per row = fp8_row_bytes(cols)
  std::vector<uint8_t> codes;     // [rows, ld]
  std::vector<float> scales;      // [rows]
};
struct Mxfp4MatrixHost {
  int rows = 0, cols = 0;
  int64_t ld = 0;                 // code bytes per row = mxfp4_row_bytes(cols)
  int64_t sld = 0;                // scale bytes per row = mxfp4_row_blocks(cols)
  std::vector<uint8_t> codes;     // [rows, ld]
  std::vector<uint8_t> scales;    // [rows, sld]
};

Fp8MatrixHost quantize_fp8(const Mat& w);      // errors name the row and column
Mat dequantize(const Fp8MatrixHost& q);
Mxfp4MatrixHost quantize_mxfp4(const Mat& w);
Mat dequantize(const Mxfp4MatrixHost& q);

}  // namespace m3
