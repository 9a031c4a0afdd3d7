// block_choice_gap / expert_choice_gap: every pair that the offered choice orders against the
// reference's scores, measured relative to the two scores' magnitude sums.
#include "ref/follow.h"

#include <algorithm>
#include <cmath>

namespace m3::ref {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative gap of a pair ranked against the scores (s_hi > s_lo): +inf when s_hi is +inf (a local
// block) or the magnitudes are 0.
double pair_gap(double s_hi, double s_lo, double m_hi, double m_lo) {
  if (std::isinf(s_hi) || std::isinf(s_lo)) return kInf;
  const double m = m_hi + m_lo;
  return m > 0 && std::isfinite(m) ? (s_hi - s_lo) / m : kInf;
}

// Ids in [0, n), distinct; marks them in `in`.
bool valid_ids(const std::vector<int32_t>& ids, int n, std::vector<uint8_t>& in) {
  in.assign(size_t(n), 0);
  for (int32_t b : ids) {
    if (b < 0 || b >= n || in[size_t(b)]) return false;
    in[size_t(b)] = 1;
  }
  return true;
}
}  // namespace

void FollowCount::merge(const FollowCount& o) {
  offered += o.offered;
  differ += o.differ;
  followed += o.followed;
  refused += o.refused;
  max_taken = std::max(max_taken, o.max_taken);
  min_refused = std::min(min_refused, o.min_refused);
}

void store_following(const CacheCodec& c, const float* x, int n, const float* offered, double tie_rel, float* dst,
                     FollowCount& cnt, int* first_refused, double* first_gap) {
  if (!offered) {
    c.store(x, n, dst);
    return;
  }
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const double rms = std::sqrt(ss / std::max(n, 1));
  for (int i = 0; i < n; ++i) {
    ++cnt.offered;
    const float own = c.round(x[i]), o = offered[i];
    dst[i] = own;
    if (o == own || (std::isnan(o) && std::isnan(own))) continue;
    // gap: the distance from x to the nearest value the codec rounds to o, over rms (o must be a
    // value the codec stores). Rounding is monotone, so that value is the edge of o's rounding
    // interval on x's side, found by bisection between x (rounds to own) and o (rounds to o).
    double gap = std::numeric_limits<double>::infinity();
    if (std::isfinite(o) && c.round(o) == o && rms > 0) {
      double lo = x[i], hi = o;
      for (int it = 0; it < 80 && lo != hi; ++it) {
        const double m = 0.5 * (lo + hi);
        if (m == lo || m == hi) break;
        (c.round(float(m)) == o ? hi : lo) = m;
      }
      // hi is a double whose float rounds to o; the float actually fed to the codec
      gap = std::fabs(double(float(hi)) - double(x[i])) / rms;
    }
    cnt.add(gap, tie_rel);
    if (gap <= tie_rel) {
      dst[i] = o;
    } else if (first_refused && *first_refused < 0) {
      *first_refused = i;
      if (first_gap) *first_gap = gap;
    }
  }
}

void FollowStats::merge(const FollowStats& o) {
  block_sets += o.block_sets;
  block_differ += o.block_differ;
  block_followed += o.block_followed;
  block_refused += o.block_refused;
  expert_lists += o.expert_lists;
  expert_differ += o.expert_differ;
  expert_followed += o.expert_followed;
  expert_refused += o.expert_refused;
  block_max_taken = std::max(block_max_taken, o.block_max_taken);
  expert_max_taken = std::max(expert_max_taken, o.expert_max_taken);
  block_min_refused = std::min(block_min_refused, o.block_min_refused);
  expert_min_refused = std::min(expert_min_refused, o.expert_min_refused);
  cache.merge(o.cache);
  if (first_refused.empty()) first_refused = o.first_refused;
}

double block_choice_gap(const float* block_scores, int num_blocks, int query_block, int topk, int local,
                        const std::vector<int32_t>& offered, const std::function<double(int)>& magnitude) {
  std::vector<double> s(static_cast<size_t>(num_blocks));
  for (int b = 0; b < num_blocks; ++b) s[size_t(b)] = std::isnan(block_scores[b]) ? -kInf : double(block_scores[b]);
  for (int i = 0; i < local; ++i) {
    const int b = query_block - i;
    if (b < 0) break;
    if (b < num_blocks) s[size_t(b)] = kInf;
  }
  // the reference's own choice has min(topk, num_blocks) entries minus those scoring -inf
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const int k = std::min(topk, num_blocks);
  int own = 0;
  for (int i = 0; i < k; ++i) own += sorted[size_t(i)] > -kInf;
  std::vector<uint8_t> in;
  if (int(offered.size()) != own || !valid_ids(offered, num_blocks, in)) return kInf;
  std::vector<double> m(static_cast<size_t>(num_blocks), -1.0);
  auto mag = [&](int b) {
    if (m[size_t(b)] < 0) m[size_t(b)] = magnitude(b);
    return m[size_t(b)];
  };
  double gap = 0;
  for (int32_t y : offered) {
    if (s[size_t(y)] == -kInf) return kInf;
    for (int x = 0; x < num_blocks; ++x)
      if (!in[size_t(x)] && s[size_t(x)] > s[size_t(y)])
        gap = std::max(gap, pair_gap(s[size_t(x)], s[size_t(y)], std::isinf(s[size_t(x)]) ? 0 : mag(x),
                                     std::isinf(s[size_t(y)]) ? 0 : mag(y)));
  }
  return gap;
}

double expert_choice_gap(const double* choice, const double* magnitude, int num_experts, int top_k,
                         const std::vector<int32_t>& offered) {
  std::vector<uint8_t> in;
  if (int(offered.size()) != top_k || !valid_ids(offered, num_experts, in)) return kInf;
  double gap = 0;
  for (size_t i = 0; i < offered.size(); ++i) {
    const int y = offered[i];
    // placed after y in the list, or left out, while the reference scores it higher
    for (size_t j = i + 1; j < offered.size(); ++j) {
      const int x = offered[j];
      if (choice[x] > choice[y]) gap = std::max(gap, pair_gap(choice[x], choice[y], magnitude[x], magnitude[y]));
    }
    for (int x = 0; x < num_experts; ++x)
      if (!in[size_t(x)] && choice[x] > choice[y])
        gap = std::max(gap, pair_gap(choice[x], choice[y], magnitude[x], magnitude[y]));
  }
  return gap;
}

}  // namespace m3::ref
