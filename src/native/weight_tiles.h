// Device copies between the row-major and the tiled FP8 layout (core/weight_tiles.h): the bench
// fills its random arenas row-major and tiles them; the GPU tests run the same codes in both
// layouts and expect the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::native {

// tiled[tiled_offset(r, c, ld)] = row_major[r * ld + c] for r < rows, c < ld; the padding rows of
// the last tile zero. ld % 64 == 0; tiled holds tiled_rows(rows) * ld bytes. Device pointers (not
// overlapping); asynchronous on `stream`.
void tile_fp8(const uint8_t* row_major, int64_t rows, int64_t ld, uint8_t* tiled, cudaStream_t stream);

}  // namespace m3::native
