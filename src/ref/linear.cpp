// linear(): rows of W split over the pool; each thread loops its rows over all tokens.
#include "ref/linear.h"

#include <algorithm>

namespace m3::ref {

void linear(const Mat& w, const float* x, int64_t x_stride, int n_tok, float* y, int64_t y_stride,
            ThreadPool& pool) {
  if (n_tok <= 0 || w.rows == 0) return;
  // grain: about 64k multiply-adds per chunk so that tiny layers do not pay for thread hand-off
  int64_t work_per_row = int64_t(w.cols) * n_tok;
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work_per_row));
  pool.parallel_for(
      w.rows,
      [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const float* wr = w.row(int(o));
          for (int t = 0; t < n_tok; ++t) y[t * y_stride + o] = float(dot(wr, x + t * x_stride, w.cols));
        }
      },
      grain);
}

}  // namespace m3::ref
