// Rope: fp32 inverse frequencies computed once; cos/sin per call in double from the fp32 angle.
#include "ref/rope.h"

#include <cmath>

namespace m3::ref {

Rope::Rope(int rotary_dim, double theta) : rotary_dim_(rotary_dim) {
  int r = rotary_dim / 2;
  inv_freq_.resize(size_t(r));
  for (int i = 0; i < r; ++i) {
    // transformers: 1 / (theta ** (arange(0, dim, 2).float() / dim)), all in fp32
    float e = float(2 * i) / float(rotary_dim);
    float pw = float(std::pow(double(float(theta)), double(e)));
    inv_freq_[size_t(i)] = 1.0f / pw;
  }
}

void Rope::apply(float* x, int64_t pos) const {
  int r = rotary_dim_ / 2;
  for (int i = 0; i < r; ++i) {
    double a = double(angle(pos, i));
    // cos/sin of the fp32 angle, rounded to fp32 like a float32 cos/sin table
    double c = double(float(std::cos(a))), s = double(float(std::sin(a)));
    double x0 = x[i], x1 = x[i + r];
    x[i] = float(x0 * c - x1 * s);
    x[i + r] = float(x1 * c + x0 * s);
  }
}

}  // namespace m3::ref
