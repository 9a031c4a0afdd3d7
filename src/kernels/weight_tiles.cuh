// Row-major -> tiled FP8 codes (core/weight_tiles.h; native/weight_tiles.h): item w of 256 threads
// strides over the 16-byte units of the tiled matrix (unit u by thread u mod 256 of item
// (u / 256) mod items), each reading the 16 bytes that belong there (zero for padding rows).
#pragma once
#include <cstdint>

#include "core/weight_tiles.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

constexpr int kTileFp8Threads = 256;

struct TileFp8Params {
  const uint8_t* src = nullptr;  // [rows][ld] row-major
  uint8_t* dst = nullptr;        // tiled_rows(rows) * ld bytes
  int64_t rows = 0, ld = 0;
  int64_t units = 0;             // tiled_rows(rows) * ld / 16
  int64_t items = 0;             // items of the launch (the stride is items * 256)
};

struct TileFp8Op : OpBounds<kTileFp8Threads> {
  using Params = TileFp8Params;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int64_t stride = p.items * kTileFp8Threads, tile_bytes = kTileRows * p.ld;
    for (int64_t u = w * kTileFp8Threads + g.tid; u < p.units; u += stride) {
      const int64_t at = 16 * u, in_tile = at % tile_bytes;
      const int64_t row = at / tile_bytes * kTileRows + in_tile % kTileBlockStride / kTileBlockBytes;
      const int64_t byte = in_tile / kTileBlockStride * kTileBlockBytes + in_tile % kTileBlockBytes;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < p.rows) v = *reinterpret_cast<const uint4*>(p.src + row * p.ld + byte);
      *reinterpret_cast<uint4*>(p.dst + at) = v;
    }
  }
};

}  // namespace m3::kernels
