// Partial NeoX (split-half) rotary embedding: channels [0, rotary_dim) of each head rotate, the
// rest pass through. With r = rotary_dim / 2, pair i (i < r) is (x_i, x_{i+r}) rotated by the
// angle p * theta^(-2i / rotary_dim):
//   y_i = x_i cos - x_{i+r} sin,   y_{i+r} = x_{i+r} cos + x_i sin.
// NOTE: the angle is formed in fp32 (inv_freq in fp32, p * inv_freq rounded to fp32) and its
// cos/sin taken from that fp32 angle, exactly as transformers (and vLLM's cos/sin cache) do; the
// golden fixtures are made that way. At long positions this differs visibly from an fp64 angle
// (ulp(1e5) ~ 8e-3 rad), so every path of the project must build its tables the same way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace m3::ref {

class Rope {
 public:
  Rope() = default;
  Rope(int rotary_dim, double theta);
  int rotary_dim() const { return rotary_dim_; }
  // The fp32 angle of pair i at position pos.
  float angle(int64_t pos, int i) const { return float(pos) * inv_freq_[size_t(i)]; }
  // Rotates one head vector in place (only its first rotary_dim channels are touched).
  void apply(float* x, int64_t pos) const;

 private:
  int rotary_dim_ = 0;
  std::vector<float> inv_freq_;  // [rotary_dim / 2], fp32
};

}  // namespace m3::ref
