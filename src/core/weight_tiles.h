// The tiled layout of the prepared FP8 projection weights (attention q|k|v|iq|ik and O), one
// definition for the host (model/prepare.cpp writes and reads it) and the device (the tensor-core
// walks of kernels/mma_linear.cuh address it).
//
// A [rows][ld] matrix of one-byte codes (ld a multiple of 64, zero past the logical columns) is
// cut into tiles of 16 rows (the last one padded with zero rows); tile i holds rows 16i .. 16i + 15
// and is stored whole at i * 16 * ld, block-major: the 64 bytes of block b (bytes 64b .. 64b + 63)
// of its row r (0..15) are at b * 1024 + r * 64. A warp of the decode walk loads, per block, rows
// g and g + 8 (g = lane / 4) at bytes 16t (t = lane % 4): in this layout those are 2 x 512
// contiguous bytes instead of 16 separate 64-byte pieces of 16 rows, and a tile is one contiguous
// range for the copy engine. The codes and therefore every sum are the same as in the row-major
// layout; only addresses change.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace m3 {

inline constexpr int kTileRows = 16;      // rows per tile
inline constexpr int kTileBlockBytes = 64;  // bytes of one row per block
inline constexpr int kTileBlockStride = kTileRows * kTileBlockBytes;  // bytes of one block of a tile

// Rows stored for `rows` logical rows (whole tiles).
M3_HOST_DEVICE constexpr int64_t tiled_rows(int64_t rows) { return (rows + kTileRows - 1) / kTileRows * kTileRows; }

// Where byte `byte` of row `row` sits in a tiled [rows][ld] matrix.
M3_HOST_DEVICE constexpr int64_t tiled_offset(int64_t row, int64_t byte, int64_t ld) {
  return row / kTileRows * kTileRows * ld + byte / kTileBlockBytes * kTileBlockStride +
         row % kTileRows * kTileBlockBytes + byte % kTileBlockBytes;
}

// Host: row-major [tiled_rows(rows)][ld] <-> tiled (rows past `rows` are written as zero / ignored).
inline void tile_rows_to(const uint8_t* row_major, int64_t rows, int64_t ld, uint8_t* tiled) {
  const int64_t all = tiled_rows(rows);
  for (int64_t r = 0; r < all; ++r)
    for (int64_t b = 0; b < ld; b += kTileBlockBytes) {
      uint8_t* d = tiled + tiled_offset(r, b, ld);
      if (r < rows) std::memcpy(d, row_major + r * ld + b, kTileBlockBytes);
      else std::memset(d, 0, kTileBlockBytes);
    }
}
inline void untile_rows_to(const uint8_t* tiled, int64_t rows, int64_t ld, uint8_t* row_major) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < ld; b += kTileBlockBytes)
      std::memcpy(row_major + r * ld + b, tiled + tiled_offset(r, b, ld), kTileBlockBytes);
}

}  // namespace m3
