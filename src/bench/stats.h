// Summary statistics of a benchmark's per-step times: median and p90 (nearest rank: the smallest
// sample with at least 90% of the samples at or below it, so it is always a measured value),
// mean, min, max. Empty input is an error.
#pragma once
#include <cstddef>
#include <vector>

namespace m3::bench {

struct Stats {
  size_t n = 0;
  double median = 0, p90 = 0, mean = 0, min = 0, max = 0;
};

// q in (0, 1]: the ceil(q * n)-th smallest sample (1-based).
double nearest_rank(std::vector<double> v, double q);
Stats summarize(const std::vector<double>& samples);

}  // namespace m3::bench
