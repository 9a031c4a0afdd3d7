// sample_token(): greedy, or temperature -> top-k -> softmax -> top-p -> one uniform draw, all in
// double over a candidate list ordered by (logit desc, id asc), so ties always resolve to the lower
// id and the result is the same on every machine for the same seed and draw index.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/counter_rng.h"

namespace m3 {

uint64_t splitmix64(uint64_t x) { return rng::splitmix64(x); }

double uniform_draw(uint64_t seed, uint64_t index) { return rng::uniform_draw(seed, index); }

void validate_sampling(const SamplingParams& p) {
  M3_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "sampling: temperature must be finite and >= 0, got {}",
           p.temperature);
  M3_CHECK(p.top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got {}", p.top_k);
  M3_CHECK(p.top_p > 0 && p.top_p <= 1, "sampling: top_p must be in (0, 1], got {}", p.top_p);
}

int argmax_token(const float* logits, int vocab) {
  M3_CHECK(vocab > 0, "sampling: vocabulary size must be > 0, got {}", vocab);
  int best = 0;
  for (int i = 0; i < vocab; ++i) {
    M3_CHECK(!std::isnan(logits[i]), "sampling: logit of token {} is NaN", i);
    if (logits[i] > logits[best]) best = i;  // strict: the lower id keeps a tie
  }
  return best;
}

std::vector<std::pair<int, double>> sampling_distribution(const float* logits, int vocab, const SamplingParams& p) {
  validate_sampling(p);
  if (p.temperature == 0) return {{argmax_token(logits, vocab), 1.0}};
  M3_CHECK(vocab > 0, "sampling: vocabulary size must be > 0, got {}", vocab);
  for (int i = 0; i < vocab; ++i) M3_CHECK(!std::isnan(logits[i]), "sampling: logit of token {} is NaN", i);
  std::vector<int> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t k = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), ids.size()) : ids.size();
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), better);
  ids.resize(k);
  // softmax over the kept candidates at temperature T (max first, so exp never overflows)
  const double inv_t = 1.0 / double(p.temperature);
  const double top = double(logits[ids[0]]);
  std::vector<std::pair<int, double>> d;
  d.reserve(k);
  double z = 0;
  M3_CHECK(top != -INFINITY, "sampling: every logit is -inf");
  for (int id : ids) {
    // the top logit(s) weigh 1 (also when +inf); -inf logits give 0
    double w = double(logits[id]) == top ? 1.0 : std::exp((double(logits[id]) - top) * inv_t);
    d.emplace_back(id, w);
    z += w;
  }
  for (auto& e : d) e.second /= z;
  if (p.top_p < 1) {
    // smallest prefix (in best-first order) whose mass reaches top_p; at least one token
    double cum = 0;
    size_t n = 0;
    while (n < d.size()) {
      cum += d[n].second;
      ++n;
      if (cum >= double(p.top_p)) break;
    }
    d.resize(n);
    for (auto& e : d) e.second /= cum;
  }
  std::erase_if(d, [](const auto& e) { return e.second <= 0; });
  return d;
}

TokenLogprob token_logprob(const float* logits, int vocab, int32_t token, int top) {
  M3_CHECK(token >= 0 && token < vocab, "token_logprob: token {} outside [0, {})", token, vocab);
  double m = -INFINITY;
  for (int i = 0; i < vocab; ++i) {
    M3_CHECK(!std::isnan(logits[i]), "token_logprob: NaN logit at {}", i);
    m = std::max(m, double(logits[i]));
  }
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - m);
  const double lse = m + std::log(sum);
  TokenLogprob r;
  r.token = token;
  r.logprob = float(double(logits[token]) - lse);
  const int k = std::clamp(top, 0, vocab);
  if (k > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) ids[size_t(i)] = i;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < k; ++i) r.top.emplace_back(ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - lse));
  }
  return r;
}

int sample_token(const float* logits, int vocab, const SamplingParams& p, SamplerState& st) {
  validate_sampling(p);
  if (p.temperature == 0) return argmax_token(logits, vocab);
  auto d = sampling_distribution(logits, vocab, p);
  double u = uniform_draw(st.seed, st.draws++);
  double cum = 0;
  for (const auto& [id, prob] : d) {
    cum += prob;
    if (u < cum) return id;
  }
  return d.back().first;  // u just below 1 with rounding in cum
}

}  // namespace m3
