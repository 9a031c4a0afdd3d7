// The host side of the RMS norm's halves (kernels/fused_norm_params.h), in the same fp32 operations
// and order as the device, so tests compare bit for bit: the chunk sums of r^2, inv from them, z.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/codecs.h"

namespace m3::test {

// The sum of r^2 over r[0 .. 16): the tree ((q0 + q8) + (q4 + q12)) + ... of the header.
inline float norm_chunk_tree(const float* r) {
  float q[16];
  for (int e = 0; e < 16; ++e) q[e] = r[e] * r[e];
  for (int m = 8; m >= 1; m >>= 1)
    for (int e = 0; e < m; ++e) q[e] = q[e] + q[e + m];
  return q[0];
}

// The chunk sums of one row of n values (n % 16 == 0).
inline std::vector<float> norm_chunk_sums(const float* r, int n) {
  std::vector<float> s(size_t(n / 16));
  for (int c = 0; c < n / 16; ++c) s[size_t(c)] = norm_chunk_tree(r + 16 * c);
  return s;
}

// inv from C chunk sums: 32 lanes add chunks l, l + 32, ... in order, then the butterfly xor 16 .. 1.
inline float norm_inv_from_chunks(const std::vector<float>& s, int n, float eps) {
  float a[32];
  for (int l = 0; l < 32; ++l) {
    a[l] = 0.f;
    for (size_t c = size_t(l); c < s.size(); c += 32) a[l] = a[l] + s[c];
  }
  for (int m = 16; m >= 1; m >>= 1) {
    float b[32];
    for (int l = 0; l < 32; ++l) b[l] = a[l] + a[l ^ m];
    for (int l = 0; l < 32; ++l) a[l] = b[l];
  }
  return 1.0f / std::sqrt(a[0] / float(n) + eps);
}

// z = r * (1 + w) with w a bf16 weight.
inline float norm_z_host(float r, uint16_t w) { return r * (1.0f + bf16_to_f32(w)); }

}  // namespace m3::test
