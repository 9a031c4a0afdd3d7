// tile_fp8 (native/weight_tiles.h) on kernels/weight_tiles.cuh: items of 256 threads stride over the
// tiled matrix's 16-byte units (at most 65535 items).
#include <algorithm>

#include "core/check.h"
#include "kernels/weight_tiles.cuh"
#include "native/launch.cuh"
#include "native/weight_tiles.h"

namespace m3::native {

void tile_fp8(const uint8_t* row_major, int64_t rows, int64_t ld, uint8_t* tiled, cudaStream_t stream) {
  M3_CHECK(row_major && tiled && rows > 0 && ld > 0 && ld % kTileBlockBytes == 0 &&
               reinterpret_cast<uintptr_t>(row_major) % 16 == 0 && reinterpret_cast<uintptr_t>(tiled) % 16 == 0,
           "tile_fp8: [{} x {} bytes] needs rows > 0, ld a multiple of {} and 16-byte aligned buffers", rows, ld,
           kTileBlockBytes);
  kernels::TileFp8Params p;
  p.src = row_major;
  p.dst = tiled;
  p.rows = rows;
  p.ld = ld;
  p.units = tiled_rows(rows) * ld / 16;
  p.items = std::min<int64_t>((p.units + kernels::kTileFp8Threads - 1) / kernels::kTileFp8Threads, 65535);
  launch_op<kernels::TileFp8Op>(p, kernels::WorkShape{p.items, kernels::kTileFp8Threads, 0}, stream, "tile_fp8");
}

}  // namespace m3::native
