// Sampling: greedy = argmax with the lowest id on ties; top-k and top-p never leave their sets;
// seeded draws are reproducible and independent of earlier draws; a small temperature tends to the
// argmax; observed frequencies match the expected distribution (chi-square, failure probability
// 1e-6 per run); bad parameters and NaN logits are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/random.h"
#include "core/check.h"
#include "runtime/sampler.h"

using namespace m3;
using m3::test::fresh_seed;

namespace {
// ids ordered best first (logit desc, id asc)
std::vector<int> ranking(const std::vector<float>& lg) {
  std::vector<int> ids(lg.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return lg[size_t(a)] > lg[size_t(b)]; });
  return ids;
}
// the distribution written out directly: softmax(lg / T) over the top-k, then the top-p nucleus
std::vector<double> expected_probs(const std::vector<float>& lg, float T, int k, float p) {
  auto r = ranking(lg);
  size_t keep = k > 0 ? std::min(size_t(k), r.size()) : r.size();
  std::vector<double> pr(lg.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += std::exp(double(lg[size_t(r[i])]) / T);
  double cum = 0;
  size_t n = 0;
  for (; n < keep; ++n) {
    cum += std::exp(double(lg[size_t(r[n])]) / T) / z;
    if (cum >= p) { ++n; break; }
  }
  n = std::min(n, keep);
  for (size_t i = 0; i < n; ++i) pr[size_t(r[i])] = std::exp(double(lg[size_t(r[i])]) / T) / z / cum;
  return pr;
}
}  // namespace

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SamplerState st{seed, 0};
  for (int rep = 0; rep < 200; ++rep) {
    int V = std::uniform_int_distribution<int>(1, 300)(rng);
    std::vector<float> lg(static_cast<size_t>(V));
    for (auto& x : lg) x = float(std::uniform_int_distribution<int>(-5, 5)(rng));  // many ties
    int want = int(std::max_element(lg.begin(), lg.end()) - lg.begin());        // first maximum
    EXPECT_EQ(sample_token(lg.data(), V, SamplingParams{}, st), want);
    EXPECT_EQ(argmax_token(lg.data(), V), want);
  }
  EXPECT_EQ(st.draws, 0u) << "greedy consumes no draws";
  std::vector<float> inf{1.f, INFINITY, INFINITY, -INFINITY};
  EXPECT_EQ(argmax_token(inf.data(), 4), 1);
}

TEST(Sampler, SeededAndCounterBased) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto lg = m3::test::random_vector(50, rng, 2.0f);
  SamplingParams p{1.0f, 0, 1.0f, seed};
  SamplerState a{seed, 0}, b{seed, 0}, c{seed + 1, 0};
  std::vector<int> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(sample_token(lg.data(), 50, p, a));
    tb.push_back(sample_token(lg.data(), 50, p, b));
    tc.push_back(sample_token(lg.data(), 50, p, c));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc) << "another seed gave the same 64 draws";  // ~ impossible for 50 tokens
  EXPECT_EQ(a.draws, 64u);
  // draw i depends only on (seed, i): jumping straight to draw 17 gives token 17
  SamplerState j{seed, 17};
  EXPECT_EQ(sample_token(lg.data(), 50, p, j), ta[17]);
  for (uint64_t i = 0; i < 1000; ++i) {
    double u = uniform_draw(seed, i);
    ASSERT_TRUE(u >= 0 && u < 1) << u;
  }
}

TEST(Sampler, TopKAndTopPStayInTheirSets) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SamplerState st{seed, 0};
  for (int rep = 0; rep < 300; ++rep) {
    int V = std::uniform_int_distribution<int>(1, 60)(rng);
    std::vector<float> lg(static_cast<size_t>(V));
    for (auto& x : lg) x = rep % 3 ? std::normal_distribution<float>(0, 2)(rng) : float(rng() % 3);
    int k = std::uniform_int_distribution<int>(0, V + 2)(rng);
    float p = rep % 4 ? std::uniform_real_distribution<float>(0.05f, 1.0f)(rng) : 1.0f;
    float T = std::uniform_real_distribution<float>(0.2f, 3.0f)(rng);
    auto want = expected_probs(lg, T, k, p);
    auto rk = ranking(lg);
    for (int d = 0; d < 20; ++d) {
      int t = sample_token(lg.data(), V, SamplingParams{T, k, p, 0}, st);
      ASSERT_TRUE(t >= 0 && t < V);
      int rank = int(std::find(rk.begin(), rk.end(), t) - rk.begin());
      if (k > 0) {
        ASSERT_LT(rank, k) << "top-k " << k << " returned rank " << rank;
      }
      ASSERT_GT(want[size_t(t)], 0.0) << "token " << t << " outside the nucleus (top_p " << p << ", k " << k << ")";
    }
    // the exposed distribution is the one written above
    auto dist = sampling_distribution(lg.data(), V, SamplingParams{T, k, p, 0});
    std::vector<double> got(size_t(V), 0.0);
    for (auto [id, pr] : dist) got[size_t(id)] = pr;
    for (int i = 0; i < V; ++i) ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-12) << "token " << i;
  }
}

TEST(Sampler, SmallTemperatureTendsToArgmax) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  SamplerState st{seed, 0};
  for (int rep = 0; rep < 50; ++rep) {
    auto lg = m3::test::random_vector(40, rng, 1.0f);
    int am = argmax_token(lg.data(), 40);
    for (auto& x : lg)
      if (&x - lg.data() != am) x = std::min(x, lg[size_t(am)] - 0.05f);  // margin >= 0.05
    // p(other) <= 39 * exp(-0.05 / 1e-3) ~ 8e-21
    for (int d = 0; d < 20; ++d) EXPECT_EQ(sample_token(lg.data(), 40, SamplingParams{1e-3f, 0, 1.0f, 0}, st), am);
  }
  // with an exact tie at the top, a tiny temperature splits between the tied ids only
  std::vector<float> tie{0.f, 3.f, 1.f, 3.f};
  auto d = sampling_distribution(tie.data(), 4, SamplingParams{1e-3f, 0, 1.0f, 0});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 3);
  EXPECT_DOUBLE_EQ(d[0].second, 0.5);
}

TEST(Sampler, FrequenciesMatchDistribution) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case { float T; int k; float p; };
  for (Case c : {Case{1.0f, 0, 1.0f}, Case{0.7f, 4, 1.0f}, Case{1.3f, 0, 0.8f}, Case{1.0f, 5, 0.9f}}) {
    const int V = 6, N = 20000;
    auto lg = m3::test::random_vector(V, rng, 1.0f);
    auto want = expected_probs(lg, c.T, c.k, c.p);
    std::vector<int> count(V, 0);
    SamplerState st{rng(), 0};
    for (int i = 0; i < N; ++i) ++count[size_t(sample_token(lg.data(), V, SamplingParams{c.T, c.k, c.p, 0}, st))];
    double chi2 = 0;
    int df = -1;
    for (int i = 0; i < V; ++i) {
      if (want[size_t(i)] == 0) {
        EXPECT_EQ(count[size_t(i)], 0) << "token " << i << " has probability 0";
        continue;
      }
      double e = N * want[size_t(i)];
      chi2 += (count[size_t(i)] - e) * (count[size_t(i)] - e) / e;
      ++df;
    }
    // chi-square upper quantiles at 1 - 1e-6 for df = 0..5 (df 0: a single token, chi2 is 0)
    const double crit[] = {1e-9, 23.9, 27.6, 30.7, 33.4, 35.9};
    EXPECT_LT(chi2, crit[df]) << "T " << c.T << " k " << c.k << " p " << c.p << " df " << df;
  }
}

TEST(Sampler, RejectsBadParameters) {
  std::vector<float> lg{0.f, 1.f};
  SamplerState st;
  EXPECT_THROW(sample_token(lg.data(), 2, SamplingParams{-1.f, 0, 1.f, 0}, st), m3::Error);
  EXPECT_THROW(sample_token(lg.data(), 2, SamplingParams{NAN, 0, 1.f, 0}, st), m3::Error);
  EXPECT_THROW(sample_token(lg.data(), 2, SamplingParams{1.f, -1, 1.f, 0}, st), m3::Error);
  EXPECT_THROW(sample_token(lg.data(), 2, SamplingParams{1.f, 0, 0.f, 0}, st), m3::Error);
  EXPECT_THROW(sample_token(lg.data(), 2, SamplingParams{1.f, 0, 1.5f, 0}, st), m3::Error);
  EXPECT_THROW(sample_token(lg.data(), 0, SamplingParams{}, st), m3::Error);
  std::vector<float> ninf{-INFINITY, -INFINITY};
  EXPECT_THROW(sample_token(ninf.data(), 2, SamplingParams{1.f, 0, 1.f, 0}, st), m3::Error);
  // +inf logits: the distribution is uniform over them, never NaN
  std::vector<float> pinf{0.f, INFINITY, 3.f, INFINITY};
  auto d = sampling_distribution(pinf.data(), 4, SamplingParams{1.f, 0, 1.f, 0});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], (std::pair<int, double>{1, 0.5}));
  EXPECT_EQ(d[1], (std::pair<int, double>{3, 0.5}));
  std::vector<float> nan{0.f, NAN};
  EXPECT_THROW(sample_token(nan.data(), 2, SamplingParams{}, st), m3::Error);
  EXPECT_THROW(sample_token(nan.data(), 2, SamplingParams{1.f, 0, 1.f, 0}, st), m3::Error);
}
