// The host's split of activation rows (kernels/act_split.cuh), for the GPU tests that hand the FP8
// decode tile split activations: hi = bf16_rn(x), lo = bf16_rn(x - hi), group q of elements
// 4q .. 4q + 3 as {hi 4q .. hi 4q+3, lo 4q .. lo 4q+3}; [M][2 ld] bf16, bf16 NaNs at and past K
// (the tile must not read them).
#pragma once
#include <cstdint>
#include <vector>

#include "core/codecs.h"

namespace m3::test {

inline std::vector<uint16_t> split_rows_host(const std::vector<float>& x, int M, int K, int64_t ld) {
  std::vector<uint16_t> s(size_t(M) * size_t(2 * ld), uint16_t(0x7fc1));
  for (int t = 0; t < M; ++t)
    for (int k = 0; k < K; ++k) {
      const float v = x[size_t(t) * ld + k];
      const uint16_t h = f32_to_bf16(v);
      uint16_t* q = &s[size_t(t) * 2 * ld + 8 * size_t(k / 4) + k % 4];
      q[0] = h;
      q[4] = f32_to_bf16(v - bf16_to_f32(h));
    }
  return s;
}

}  // namespace m3::test
