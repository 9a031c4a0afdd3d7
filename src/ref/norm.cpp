// gemma_rms_norm(): mean of squares in double, then one reciprocal square root for the row.
#include "ref/norm.h"

#include <cmath>

namespace m3::ref {

void gemma_rms_norm(const float* x, const float* w, int n, float eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  double r = 1.0 / std::sqrt(ss / n + double(eps));
  for (int i = 0; i < n; ++i) y[i] = float(double(x[i]) * r * (1.0 + double(w[i])));
}

}  // namespace m3::ref
