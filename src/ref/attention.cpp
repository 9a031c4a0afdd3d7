// attend_head(): two passes over the listed keys (scores with a running max, then the weighted
// sum of values), all in double; the key order is the caller's (ascending positions).
#include "ref/attention.h"

#include <cmath>
#include <vector>

#include "ref/linear.h"

namespace m3::ref {

void attend_head(const float* q, const float* k, const float* v, int64_t stride, const int64_t* slots, int n,
                 int dim, double scale, float* out) {
  thread_local std::vector<double> s, acc;
  s.resize(size_t(n));
  acc.assign(size_t(dim), 0.0);
  double m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    s[size_t(j)] = scale * dot(q, k + slots[j] * stride, dim);
    if (s[size_t(j)] > m) m = s[size_t(j)];
  }
  double z = 0;
  for (int j = 0; j < n; ++j) {
    double w = std::exp(s[size_t(j)] - m);
    z += w;
    const float* vr = v + slots[j] * stride;
    for (int d = 0; d < dim; ++d) acc[size_t(d)] += w * double(vr[d]);
  }
  for (int d = 0; d < dim; ++d) out[d] = float(acc[size_t(d)] / z);
}

}  // namespace m3::ref
