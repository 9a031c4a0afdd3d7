#include "common/compare.h"

#include <fmt/format.h>

#include <cmath>

namespace m3::test {

std::string CompareResult::describe() const {
  return fmt::format("n={} worst at [{}]: got {:.8g} ref {:.8g} (|d|={:.3g}); max|d|={:.3g} max|ref|={:.3g} "
                     "cos={:.9f} nan_mismatch={}",
                     n, worst_index, worst_got, worst_ref, std::fabs(worst_got - worst_ref), max_abs_err,
                     max_abs_ref, cosine, nan_mismatch);
}

CompareResult compare(std::span<const float> got, std::span<const float> ref, double atol, double rtol) {
  CompareResult r;
  r.n = ref.size();
  if (got.size() != ref.size()) {
    r.ok = false;
    r.nan_mismatch = got.size() > ref.size() ? got.size() - ref.size() : ref.size() - got.size();
    return r;
  }
  double worst = -1, dot = 0, ng = 0, nr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = got[i], f = ref[i];
    bool gn = std::isnan(g), fn = std::isnan(f);
    if (gn || fn) {
      if (gn != fn) {
        ++r.nan_mismatch;
        if (worst < INFINITY) { worst = INFINITY; r.worst_index = i; r.worst_got = g; r.worst_ref = f; }
      }
      continue;
    }
    double d = std::fabs(g - f);
    r.max_abs_err = std::max(r.max_abs_err, d);
    r.max_abs_ref = std::max(r.max_abs_ref, std::fabs(f));
    // exact comparisons (atol = rtol = 0) pass only equal elements: 0/0 would be NaN
    double score = d == 0 ? 0.0 : d / (atol + rtol * std::fabs(f));
    if (!(score <= worst)) { worst = score; r.worst_index = i; r.worst_got = g; r.worst_ref = f; }
    dot += g * f; ng += g * g; nr += f * f;
  }
  r.cosine = (ng > 0 && nr > 0) ? dot / std::sqrt(ng * nr) : (ng == nr ? 1.0 : 0.0);
  r.ok = r.nan_mismatch == 0 && worst <= 1.0;
  return r;
}

}  // namespace m3::test
