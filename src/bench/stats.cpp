// Median / p90 / mean / min / max of per-step samples (stats.h). The median of an even count is
// the mean of the two middle samples; p90 is nearest-rank.
#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace m3::bench {

double nearest_rank(std::vector<double> v, double q) {
  M3_CHECK(!v.empty(), "bench stats: no samples");
  M3_CHECK(q > 0 && q <= 1, "bench stats: quantile {} outside (0, 1]", q);
  std::sort(v.begin(), v.end());
  size_t rank = size_t(std::ceil(q * double(v.size()) - 1e-9));  // 1-based
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

Stats summarize(const std::vector<double>& samples) {
  M3_CHECK(!samples.empty(), "bench stats: no samples");
  for (double x : samples) M3_CHECK(std::isfinite(x), "bench stats: sample {} is not finite", x);
  std::vector<double> v = samples;
  std::sort(v.begin(), v.end());
  Stats s;
  s.n = v.size();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p90 = nearest_rank(v, 0.9);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace m3::bench
