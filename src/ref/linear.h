// Linear layers of the CPU reference: y = W x for a batch of token rows, W row-major [out, in].
// Every output element is one dot product with double accumulation in a fixed order, so results
// are the same for any thread count, batch composition or chunking (batch invariance).
#pragma once
#include <cstdint>

#include "core/parallel.h"
#include "model/weights.h"

namespace m3::ref {

// Fixed-order dot product: four interleaved double partial sums combined as (s0+s1)+(s2+s3).
// Products of two floats are exact in double, so the only rounding is in the sums.
inline double dot(const float* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(a[i]) * double(b[i]);
    s1 += double(a[i + 1]) * double(b[i + 1]);
    s2 += double(a[i + 2]) * double(b[i + 2]);
    s3 += double(a[i + 3]) * double(b[i + 3]);
  }
  for (; i < n; ++i) s0 += double(a[i]) * double(b[i]);
  return (s0 + s1) + (s2 + s3);
}

// y[t * y_stride + o] = float(dot(W.row(o), x + t * x_stride)) for t < n_tok, o < W.rows.
// Parallel over output rows (each row of W is read once for all tokens).
void linear(const Mat& w, const float* x, int64_t x_stride, int n_tok, float* y, int64_t y_stride,
            ThreadPool& pool);

}  // namespace m3::ref
