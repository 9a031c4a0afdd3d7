// The router rounding probe (ref/router_probe.h, ref/router_capture.h, ref/router_end_to_end.h):
//   - BF16 rounding of the weight matches an independent round-to-nearest-even;
//   - the captured rows are the routers' inputs: routing them reproduces the experts the FP32 run traced;
//   - on the fixtures' captured rows (routers made FP32 by a fresh perturbation below half a BF16
//     step, one near-tie planted per layer so a set must change), and on random routers and rows,
//     the probe's per-row top-k sets, changed-set flags, margins, weights and logit differences
//     agree with an independent double-precision computation of both routers;
//   - a router that is already BF16-exact (the fixtures' own) reports no change at all;
//   - end-to-end: exact routers never diverge; run B is the BF16-rounded model; the first
//     divergence and its margins are those of the two token lists and logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common/random.h"
#include "core/parallel.h"
#include "model/load_weights.h"
#include "model/spec.h"
#include "ref/engine.h"
#include "ref/greedy_run.h"
#include "ref/linear.h"
#include "ref/moe.h"
#include "ref/router_capture.h"
#include "ref/router_end_to_end.h"
#include "ref/router_probe.h"

using namespace m3;
using m3::test::fresh_seed;

namespace {

const char* const kFixtures[] = {"tiny-m3-a", "tiny-m3-b"};
std::string fixture_dir(const char* name) { return std::string(M3_TEST_DATA) + "/" + name; }

int rint(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::vector<int> moe_layers(const ModelSpec& s) {
  std::vector<int> out;
  for (int l = 0; l < s.num_layers; ++l)
    if (s.moe(l)) out.push_back(l);
  return out;
}

// Round to the nearest value with 8 significant bits (BF16's 1 + 7), ties to even, computed on
// the double mantissa (frexp / nearbyint in the default round-to-nearest-even mode). Exact for
// the normal floats a router holds (BF16 shares fp32's exponent range).
double bf16_round_ref(float f) {
  if (f == 0) return f;
  int e = 0;
  const double m = std::frexp(double(f), &e);  // |m| in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

// One row through a router, everything in double: plain-order dot products, sigmoid, bias,
// top-k by score (ties to the lower id), renormalized weights.
struct DoubleRoute {
  std::vector<double> logits, score, choice;
  std::vector<int> order;  // all experts, best first
  std::vector<int> set;    // the top-k ids, sorted
  double margin = 0;       // k-th minus (k+1)-th choice score; +inf when k == E
  double weight(int e) const {  // renormalized weight of expert e (0 when not chosen)
    if (!std::binary_search(set.begin(), set.end(), e)) return 0;
    double sum = 0;
    for (int c : set) sum += score[size_t(c)];
    return score[size_t(e)] / sum;
  }
};
DoubleRoute route_double(const std::vector<double>& w, const Vec& bias, const float* x, int E, int H, int k) {
  DoubleRoute r;
  for (int e = 0; e < E; ++e) {
    double z = 0;
    for (int h = 0; h < H; ++h) z += w[size_t(e) * H + h] * double(x[h]);
    r.logits.push_back(z);
    r.score.push_back(1 / (1 + std::exp(-z)));
    r.choice.push_back(r.score.back() + double(bias[size_t(e)]));
  }
  r.order.resize(size_t(E));
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [&](int a, int b) { return r.choice[size_t(a)] > r.choice[size_t(b)]; });
  r.set.assign(r.order.begin(), r.order.begin() + k);
  std::sort(r.set.begin(), r.set.end());
  r.margin = k == E ? std::numeric_limits<double>::infinity()
                    : r.choice[size_t(r.order[size_t(k - 1)])] - r.choice[size_t(r.order[size_t(k)])];
  return r;
}

std::vector<double> as_double(const Mat& w) { return {w.data.begin(), w.data.end()}; }
std::vector<double> as_double_bf16(const Mat& w) {
  std::vector<double> out;
  for (float v : w.data) out.push_back(bf16_round_ref(v));
  return out;
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Both routers of one layer in double over every row.
struct DoubleRouters {
  std::vector<DoubleRoute> a, b;
  int changed = 0;  // rows whose sets differ
};
DoubleRouters routers_double(const Mat& w, const Vec& bias, const float* x, int n, int k) {
  DoubleRouters d;
  const std::vector<double> wa = as_double(w), wb = as_double_bf16(w);
  for (int r = 0; r < n; ++r) {
    d.a.push_back(route_double(wa, bias, x + size_t(r) * w.cols, w.rows, w.cols, k));
    d.b.push_back(route_double(wb, bias, x + size_t(r) * w.cols, w.rows, w.cols, k));
    d.changed += d.a.back().set != d.b.back().set;
  }
  return d;
}

// Where the probe may legitimately disagree with double: it rounds each logit to fp32 (relative
// 2^-24) and sums in another order (relative ~1e-16), so a choice score (sigmoid slope <= 1/4) can
// move by 2^-26 |logit| and a margin by twice that. Rows whose double margin (of either router)
// is within kTieRel * max(1, max|logit|) are near-ties the two computations may order either way.
constexpr double kTieRel = 1e-7;
constexpr double kWeightTol = 2e-7;  // see the weights' check below
double tie_bound(const DoubleRoute& r) {
  double m = 1;
  for (double z : r.logits) m = std::max(m, std::fabs(z));
  return kTieRel * m;
}

// Checks the probe's per-row results for one layer against the double routers. Returns the rows
// skipped as near-ties.
int expect_agrees_with_double(const ref::RouterComparison& c, const DoubleRouters& d, double weight_tol,
                              const std::string& where) {
  const int n = int(d.a.size());
  EXPECT_EQ(c.rows, n) << where;
  EXPECT_EQ(int(c.per_row.size()), n) << where;
  if (int(c.per_row.size()) != n) return 0;
  int ties = 0, changed = 0, weights_changed = 0, at_threshold = 0, worst_row = -1;
  double max_logit_diff = 0, all_max_abs_logit = 1, worst_margin_ratio = 0, worst_weight_err = 0;
  for (int r = 0; r < n; ++r) {
    const auto& p = c.per_row[size_t(r)];
    const DoubleRoute &A = d.a[size_t(r)], &B = d.b[size_t(r)];
    const double bound = std::max(tie_bound(A), tie_bound(B));
    double logit_diff = 0, max_abs_logit = 1;
    for (size_t e = 0; e < A.logits.size(); ++e) {
      logit_diff = std::max(logit_diff, std::fabs(A.logits[e] - B.logits[e]));
      max_abs_logit = std::max({max_abs_logit, std::fabs(A.logits[e]), std::fabs(B.logits[e])});
    }
    max_logit_diff = std::max(max_logit_diff, logit_diff);
    all_max_abs_logit = std::max(all_max_abs_logit, max_abs_logit);
    // each probe logit is within 2^-24 |logit| of the exact one (plus the sum's ~1e-16): 2^-23 on a difference
    EXPECT_NEAR(p.max_logit_diff, logit_diff, 0x1p-23 * max_abs_logit) << where << " row " << r;
    if (A.margin < bound || B.margin < bound) {
      ++ties;
      continue;
    }
    const bool set_changed = A.set != B.set;
    changed += set_changed;
    EXPECT_EQ(sorted(p.experts_a), A.set) << where << " row " << r << ": FP32 router's set";
    EXPECT_EQ(sorted(p.experts_b), B.set) << where << " row " << r << ": BF16 router's set";
    EXPECT_EQ(p.set_changed, set_changed) << where << " row " << r;
    // margins: within the tie bound (the fp32 rounding of the logits, above); +inf both or neither
    if (std::isinf(A.margin)) EXPECT_TRUE(std::isinf(p.margin_a)) << where << " row " << r;
    else if (std::fabs(p.margin_a - A.margin) / tie_bound(A) > worst_margin_ratio) {
      worst_margin_ratio = std::fabs(p.margin_a - A.margin) / tie_bound(A);
      worst_row = r;
    }
    // weights (<= 1): stored as float (half an ulp: <= 6e-8) from scores the logits' rounding moved
    // by <= 2^-26 |logit|; kWeightTol = 2e-7 covers both (measured worst: 4e-8) and is far below
    // any real error (a weight not renormalized is off by ~0.5); a difference of two: 2 kWeightTol
    double wdiff = 0;
    for (size_t k = 0; k < p.experts_a.size(); ++k) {
      worst_weight_err = std::max(worst_weight_err, std::fabs(p.weights_a[k] - A.weight(p.experts_a[k])));
      worst_weight_err = std::max(worst_weight_err, std::fabs(p.weights_b[k] - B.weight(p.experts_b[k])));
    }
    for (size_t e = 0; e < A.logits.size(); ++e) wdiff = std::max(wdiff, std::fabs(A.weight(int(e)) - B.weight(int(e))));
    EXPECT_NEAR(p.max_weight_diff, wdiff, 2 * kWeightTol) << where << " row " << r;
    weights_changed += wdiff > weight_tol;
    at_threshold += std::fabs(wdiff - weight_tol) <= 2 * kWeightTol;  // within its own error of the threshold
  }
  EXPECT_LE(worst_margin_ratio, 1.0) << where << ": worst top-k margin error (in tie bounds) at row " << worst_row;
  EXPECT_LE(worst_weight_err, kWeightTol) << where << ": worst renormalized weight error";
  // totals: exact away from near-ties and from rows whose weight change sits on the threshold
  EXPECT_GE(c.sets_changed, changed) << where;
  EXPECT_LE(c.sets_changed, changed + ties) << where;
  EXPECT_GE(c.weights_changed, weights_changed - at_threshold) << where;
  EXPECT_LE(c.weights_changed, weights_changed + ties + at_threshold) << where;
  EXPECT_NEAR(c.max_logit_diff, max_logit_diff, 0x1p-23 * all_max_abs_logit) << where;
  return ties;
}

// Perturbs every router weight of w (BF16-exact, non-zero) by a fresh uniform fraction in
// (-0.45, 0.45) of its smaller neighbouring BF16 step (below a power of two the step halves), so
// the weight is no longer BF16-exact but still rounds back to the fixture's value.
void perturb_routers(const ModelSpec& s, ModelWeights& w, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-0.45, 0.45);
  for (int l : moe_layers(s))
    for (float& v : w.layers[size_t(l)].router.data) {
      ASSERT_NE(v, 0.0f);
      int e = 0;
      const double m = std::frexp(double(v), &e);
      const double step = std::ldexp(1.0, std::fabs(m) == 0.5 ? e - 9 : e - 8);
      v = float(double(v) + u(rng) * step);
    }
}

// Plants a near-tie that BF16 rounding must flip: for a row whose k-th and (k+1)-th experts
// (a, b) move apart by D under rounding, set b's correction bias so that under the FP32 router
// they are D/2 apart in the order rounding reverses. Tries rows by |D|, largest first, and keeps
// the first one the double computation confirms as flipped (returns it; -1 when none).
int plant_flip(LayerWeights& lw, const float* x, int n, int k, double* gap) {
  const int E = lw.router.rows;
  if (k >= E) return -1;
  const std::vector<double> wa = as_double(lw.router), wb = as_double_bf16(lw.router);
  std::vector<std::pair<double, int>> cand;
  for (int r = 0; r < n; ++r) {
    const float* xr = x + size_t(r) * lw.router.cols;
    DoubleRoute A = route_double(wa, lw.router_bias, xr, E, lw.router.cols, k);
    DoubleRoute B = route_double(wb, lw.router_bias, xr, E, lw.router.cols, k);
    const int a = A.order[size_t(k - 1)], b = A.order[size_t(k)];
    const double D = (B.score[size_t(b)] - A.score[size_t(b)]) - (B.score[size_t(a)] - A.score[size_t(a)]);
    cand.push_back({std::fabs(D), r});
  }
  std::sort(cand.rbegin(), cand.rend());
  const Vec saved = lw.router_bias;
  for (size_t i = 0; i < std::min<size_t>(cand.size(), 8); ++i) {
    const int r = cand[i].second;
    const float* xr = x + size_t(r) * lw.router.cols;
    DoubleRoute A = route_double(wa, lw.router_bias, xr, E, lw.router.cols, k);
    DoubleRoute B = route_double(wb, lw.router_bias, xr, E, lw.router.cols, k);
    const int a = A.order[size_t(k - 1)], b = A.order[size_t(k)];
    const double D = (B.score[size_t(b)] - A.score[size_t(b)]) - (B.score[size_t(a)] - A.score[size_t(a)]);
    // b's choice score to a's, minus D/2 (b stays just behind a, overtakes it under rounding) or
    // plus |D|/2 (b just ahead, falls behind)
    const double target = A.choice[size_t(a)] - D / 2;
    lw.router_bias[size_t(b)] = float(double(lw.router_bias[size_t(b)]) + (target - A.choice[size_t(b)]));
    DoubleRoute A2 = route_double(wa, lw.router_bias, xr, E, lw.router.cols, k);
    DoubleRoute B2 = route_double(wb, lw.router_bias, xr, E, lw.router.cols, k);
    if (A2.set != B2.set && A2.margin > 100 * tie_bound(A2) && B2.margin > 100 * tie_bound(B2)) {
      *gap = A2.margin;
      return r;
    }
    lw.router_bias = saved;
  }
  return -1;
}

ref::RouterCapture capture(const ModelSpec& s, const ModelWeights& w, std::mt19937_64& rng, int* prompt_len = nullptr,
                           int* decode = nullptr) {
  const int P = rint(rng, 6, 24), N = rint(rng, 2, 6);
  if (prompt_len) *prompt_len = P;
  if (decode) *decode = N;
  ref::CaptureOptions co;
  co.threads = 2;
  return ref::capture_router_inputs(s, w, test::random_tokens(P, s.vocab_size, rng), N, moe_layers(s), co);
}

TEST(RouterProbe, Bf16RoundingMatchesIndependentRounding) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Mat w(37, 53);
  std::uniform_real_distribution<double> mag(-30, 30);
  for (float& v : w.data) v = float(std::ldexp(std::normal_distribution<double>(0, 1)(rng), int(mag(rng))));
  // exact halfway cases: 1 + 2^-8 ties down to 1 (even), 1 + 3 * 2^-8 up to 1 + 2^-6 (even)
  w.data[0] = 1.0f + 0x1p-8f;
  w.data[1] = 1.0f + 3 * 0x1p-8f;
  w.data[2] = -(1.0f + 3 * 0x1p-8f);
  w.data[3] = 0.0f;
  w.data[4] = 0.5f;
  Mat r = ref::round_to_bf16(w);
  EXPECT_EQ(r.data[0], 1.0f);
  EXPECT_EQ(r.data[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(r.data[2], -(1.0f + 0x1p-6f));
  int64_t inexact = 0, worst = -1;
  for (size_t i = 0; i < w.data.size(); ++i) {
    const double ref = bf16_round_ref(w.data[i]);
    inexact += ref != double(w.data[i]);
    if (double(r.data[i]) != ref && worst < 0) worst = int64_t(i);
  }
  EXPECT_EQ(worst, -1) << "first mismatch at " << worst << ": " << w.data[size_t(std::max<int64_t>(worst, 0))];
  EXPECT_EQ(ref::count_bf16_inexact(w), inexact);
  EXPECT_EQ(ref::count_bf16_inexact(r), 0);
  EXPECT_GT(inexact, int64_t(w.data.size()) / 2);  // random fp32 values are almost never BF16-exact
}

TEST(RouterProbe, CapturedRowsAreTheRouterInputs) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const ModelSpec s = load_model_spec(fixture_dir(name));
    const ModelWeights w = load_model_weights(fixture_dir(name), s);
    const int P = rint(rng, 3, 20), N = rint(rng, 1, 5);
    const std::vector<int32_t> prompt = test::random_tokens(P, s.vocab_size, rng);
    // every other MoE layer, last first: rows must land with the layer asked for, in its slot
    std::vector<int> layers;
    for (int l : moe_layers(s)) layers.insert(layers.begin(), l);
    ref::CaptureOptions co;
    co.threads = 2;
    const ref::RouterCapture cap = ref::capture_router_inputs(s, w, prompt, N, layers, co);
    ASSERT_EQ(cap.n_rows(), P + N);
    ASSERT_EQ(cap.layers, layers);

    // the same run, traced: its expert lists per token
    auto b = ref::make_ref_backend(s, w, ref::RefOptions(64, 2));
    ref::GreedyOptions go;
    go.keep_traces = true;
    const ref::GreedyRun run = ref::greedy_run(*b, prompt, N + 1, go);
    std::vector<int32_t> fed = prompt;
    fed.insert(fed.end(), run.tokens.begin(), run.tokens.end() - 1);
    EXPECT_EQ(cap.tokens, fed);
    ThreadPool pool(2);
    for (size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      const LayerWeights& lw = w.layers[size_t(l)];
      std::vector<float> logits(size_t(cap.n_rows()) * size_t(s.num_experts));
      ref::linear(lw.router, cap.layer_rows(int(i)), s.hidden, cap.n_rows(), logits.data(), s.num_experts, pool);
      int row = 0, bad = 0;
      for (const auto& tr : run.traces) {
        const size_t mi = size_t(std::find(tr.moe_layers.begin(), tr.moe_layers.end(), l) - tr.moe_layers.begin());
        ASSERT_LT(mi, tr.experts.size());
        for (const auto& traced : tr.experts[mi]) {
          ref::Route r = ref::route_token(logits.data() + size_t(row) * s.num_experts, lw.router_bias.data(),
                                          s.num_experts, s.top_k, s.routed_scale);
          if (std::vector<int32_t>(r.experts.begin(), r.experts.end()) != traced && bad++ == 0)
            ADD_FAILURE() << "layer " << l << " row " << row << ": captured row routes elsewhere than the run";
          ++row;
        }
      }
      EXPECT_EQ(row, cap.n_rows()) << "layer " << l;
      EXPECT_EQ(bad, 0) << "layer " << l;
    }
  }
}

TEST(RouterProbe, AgreesWithDoubleOnFixtureRows) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const ModelSpec s = load_model_spec(fixture_dir(name));
    const ModelWeights fixture = load_model_weights(fixture_dir(name), s);
    const ref::RouterCapture cap = capture(s, fixture, rng);  // fixed rows of the fixture's own FP32 run
    ModelWeights w = fixture;
    perturb_routers(s, w, rng);
    for (size_t i = 0; i < cap.layers.size(); ++i) {
      const int l = cap.layers[i];
      const std::string where = std::string(name) + " layer " + std::to_string(l);
      LayerWeights lw;
      lw.router = w.layers[size_t(l)].router;
      lw.router_bias = w.layers[size_t(l)].router_bias;
      double gap = 0;
      const int planted = plant_flip(lw, cap.layer_rows(int(i)), cap.n_rows(), s.top_k, &gap);
      ASSERT_GE(planted, 0) << where << ": no row could be made to flip";
      const double tol = 1e-3;
      ref::RouterLayerProbe p = ref::probe_router_rounding(lw, l, s.top_k, cap.layer_rows(int(i)), cap.n_rows(), tol, pool);
      int64_t inexact = 0;
      for (float v : lw.router.data) inexact += bf16_round_ref(v) != double(v);
      EXPECT_EQ(p.bf16_inexact, inexact) << where;
      EXPECT_GT(p.bf16_inexact, p.weight_elements * 9 / 10) << where;  // the perturbation reached nearly every element
      const DoubleRouters d = routers_double(lw.router, lw.router_bias, cap.layer_rows(int(i)), cap.n_rows(), s.top_k);
      const int ties = expect_agrees_with_double(p.cmp, d, tol, where);
      EXPECT_LE(ties, 1) << where << ": near-ties should be rare on " << cap.n_rows() << " rows";
      EXPECT_GE(d.changed, 1) << where << ": the planted row (" << planted << ") did not flip";
      EXPECT_TRUE(p.cmp.per_row[size_t(planted)].set_changed) << where << " planted row " << planted;
      EXPECT_NEAR(p.cmp.per_row[size_t(planted)].margin_a, gap, tie_bound(d.a[size_t(planted)])) << where;
    }
  }
}

TEST(RouterProbe, AgreesWithDoubleOnRandomRouters) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  int changed_total = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int E = rint(rng, 2, 48), H = rint(rng, 4, 160), k = trial == 0 ? E : rint(rng, 1, E - 1), n = rint(rng, 50, 300);
    const std::string where = "trial " + std::to_string(trial) + " E " + std::to_string(E) + " H " +
                              std::to_string(H) + " k " + std::to_string(k);
    LayerWeights lw;
    lw.router = Mat(E, H);
    test::fill_normal(lw.router.data, rng, float(1 / std::sqrt(double(H))));  // unit-scale logits for unit rows
    lw.router_bias = test::random_vector(size_t(E), rng, 0.05f);
    const std::vector<float> x = test::random_vector(size_t(n) * size_t(H), rng);
    double gap = 0;
    const int planted = plant_flip(lw, x.data(), n, k, &gap);
    if (k < E) {
      ASSERT_GE(planted, 0) << where;
    }
    const double tol = std::ldexp(1.0, -rint(rng, 6, 14));
    ref::RouterLayerProbe p = ref::probe_router_rounding(lw, 7, k, x.data(), n, tol, pool);
    EXPECT_EQ(p.layer, 7);
    EXPECT_EQ(p.weight_elements, int64_t(E) * H);
    const DoubleRouters d = routers_double(lw.router, lw.router_bias, x.data(), n, k);
    const int ties = expect_agrees_with_double(p.cmp, d, tol, where);
    EXPECT_LE(ties, n / 50) << where;
    changed_total += d.changed;
    if (k == E) {
      EXPECT_EQ(p.cmp.sets_changed, 0) << where;
      EXPECT_TRUE(std::isinf(p.cmp.min_margin)) << where;
    } else {
      EXPECT_TRUE(p.cmp.per_row[size_t(planted)].set_changed) << where << " planted row " << planted;
      double min_margin = INFINITY;
      for (const auto& r : d.a) min_margin = std::min(min_margin, r.margin);
      // the tie bound at the scale of these logits (|logit| of a few units): 1e-7 * 10
      EXPECT_NEAR(p.cmp.min_margin, min_margin, 10 * kTieRel) << where;
    }
  }
  EXPECT_GE(changed_total, 11);  // one planted flip in every trial with k < E
}

TEST(RouterProbe, Bf16ExactRouterReportsNoChange) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  // the fixtures' routers are stored as fp32 holding BF16 values (transformers wrote them as bf16)
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const ModelSpec s = load_model_spec(fixture_dir(name));
    const ModelWeights w = load_model_weights(fixture_dir(name), s);
    const ref::RouterCapture cap = capture(s, w, rng);
    for (size_t i = 0; i < cap.layers.size(); ++i) {
      const LayerWeights& lw = w.layers[size_t(cap.layers[i])];
      ref::RouterLayerProbe p =
          ref::probe_router_rounding(lw, cap.layers[i], s.top_k, cap.layer_rows(int(i)), cap.n_rows(), 1e-9, pool);
      EXPECT_EQ(p.bf16_inexact, 0);
      EXPECT_EQ(p.cmp.sets_changed, 0);
      EXPECT_EQ(p.cmp.weights_changed, 0);  // even at a 1e-9 threshold: the routers are identical
      EXPECT_EQ(p.cmp.max_logit_diff, 0.0);
      EXPECT_EQ(p.cmp.max_weight_diff, 0.0);
      EXPECT_GT(p.cmp.min_margin, 0.0);
      EXPECT_EQ(p.cmp.rows, cap.n_rows());
    }
  }
  // a random router rounded first
  LayerWeights lw;
  lw.router = Mat(rint(rng, 5, 40), rint(rng, 8, 100));
  test::fill_normal(lw.router.data, rng, 0.1f);
  lw.router = ref::round_to_bf16(lw.router);
  lw.router_bias = test::random_vector(size_t(lw.router.rows), rng, 0.05f);
  const int n = 200;
  const std::vector<float> x = test::random_vector(size_t(n) * size_t(lw.router.cols), rng);
  ref::RouterLayerProbe p = ref::probe_router_rounding(lw, 0, rint(rng, 1, lw.router.rows), x.data(), n, 1e-9, pool);
  EXPECT_EQ(p.bf16_inexact, 0);
  EXPECT_EQ(p.cmp.sets_changed, 0);
  EXPECT_EQ(p.cmp.weights_changed, 0);
  EXPECT_EQ(p.cmp.max_logit_diff, 0.0);
}

TEST(RouterProbe, RejectsBadInput) {
  ThreadPool pool(1);
  LayerWeights dense;
  float x[4] = {};
  EXPECT_THROW(ref::probe_router_rounding(dense, 0, 1, x, 1, 1e-3, pool), m3::Error);
  LayerWeights lw;
  lw.router = Mat(3, 4);
  lw.router_bias = Vec(3);
  EXPECT_THROW(ref::probe_router_rounding(lw, 1, 4, x, 1, 1e-3, pool), m3::Error);  // top_k > E
  EXPECT_THROW(ref::probe_router_rounding(lw, 1, 0, x, 1, 1e-3, pool), m3::Error);
  EXPECT_THROW(ref::probe_router_rounding(lw, 1, 2, x, 1, 0.0, pool), m3::Error);
  lw.router_bias = Vec(2);
  EXPECT_THROW(ref::probe_router_rounding(lw, 1, 2, x, 1, 1e-3, pool), m3::Error);
  const ModelSpec s = load_model_spec(fixture_dir("tiny-m3-a"));
  const ModelWeights w = load_model_weights(fixture_dir("tiny-m3-a"), s);
  EXPECT_THROW(ref::capture_router_inputs(s, w, {1, 2}, 1, {0}), m3::Error);        // dense layer
  EXPECT_THROW(ref::capture_router_inputs(s, w, {1, 2}, 1, {s.num_layers}), m3::Error);
  EXPECT_THROW(ref::capture_router_inputs(s, w, {1, 2}, 1, {1, 1}), m3::Error);
  EXPECT_THROW(ref::capture_router_inputs(s, w, {1, 2}, -1, {1}), m3::Error);
}

TEST(RouterEndToEnd, ExactRoutersNeverDiverge) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const ModelSpec s = load_model_spec(fixture_dir(name));
    const int P = rint(rng, 3, 16), steps = rint(rng, 3, 10);
    const std::vector<int> layers = moe_layers(s);
    int loads = 0;
    ref::EndToEndOptions eo;
    eo.threads = 2;
    ref::EndToEndComparison c = ref::router_end_to_end(
        s, [&] { ++loads; return load_model_weights(fixture_dir(name), s); }, test::random_tokens(P, s.vocab_size, rng),
        steps, layers, eo);
    EXPECT_EQ(loads, 2);
    EXPECT_EQ(c.first_divergence, -1);
    EXPECT_EQ(c.tokens_a, c.tokens_b);
    EXPECT_EQ(c.compared_steps, steps);
    EXPECT_EQ(c.max_logit_diff, 0.0);
    EXPECT_EQ(c.expert_sets, int64_t(P + steps - 1) * int64_t(layers.size()));
    EXPECT_EQ(c.expert_sets_changed, 0);
    EXPECT_TRUE(std::isnan(c.margin_a));
  }
}

TEST(RouterEndToEnd, RunBIsTheBf16RoundedModel) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const char* name = kFixtures[rint(rng, 0, 1)];
  SCOPED_TRACE(name);
  const ModelSpec s = load_model_spec(fixture_dir(name));
  const ModelWeights fixture = load_model_weights(fixture_dir(name), s);
  ModelWeights perturbed = fixture;  // rounds back to the fixture
  perturb_routers(s, perturbed, rng);
  const std::vector<int32_t> prompt = test::random_tokens(rint(rng, 3, 16), s.vocab_size, rng);
  const int steps = rint(rng, 4, 12);
  ref::EndToEndOptions eo;
  eo.threads = 2;
  ref::EndToEndComparison c = ref::router_end_to_end(s, [&] { return perturbed; }, prompt, steps, moe_layers(s), eo);
  ref::GreedyOptions go;
  go.keep_logits = go.keep_traces = true;
  auto greedy = [&](const ModelWeights& w) {
    auto b = ref::make_ref_backend(s, w, ref::RefOptions(64, 2));
    return ref::greedy_run(*b, prompt, steps, go);
  };
  const ref::EndToEndComparison want = ref::compare_greedy_runs(greedy(perturbed), greedy(fixture), moe_layers(s));
  EXPECT_EQ(c.tokens_a, want.tokens_a);
  EXPECT_EQ(c.tokens_b, want.tokens_b);
  EXPECT_EQ(c.first_divergence, want.first_divergence);
  EXPECT_EQ(c.max_logit_diff, want.max_logit_diff);  // the reference is deterministic: bitwise
  EXPECT_GT(c.max_logit_diff, 0.0);                  // and the perturbation is visible in the logits
  EXPECT_EQ(c.expert_sets_changed, want.expert_sets_changed);
}

TEST(RouterEndToEnd, FirstDivergenceAndMargins) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelSpec s = load_model_spec(fixture_dir("tiny-m3-b"));
  const ModelWeights wa = load_model_weights(fixture_dir("tiny-m3-b"), s);
  ModelWeights wb = wa;  // every router negated: expert choices differ at once, tokens soon
  const std::vector<int> layers = moe_layers(s);
  for (int l : layers)
    for (float& v : wb.layers[size_t(l)].router.data) v = -v;
  const int steps = 24;
  ref::GreedyOptions go;
  go.keep_logits = go.keep_traces = true;
  std::vector<int32_t> prompt;
  auto run = [&](const ModelWeights& w) {
    auto b = ref::make_ref_backend(s, w, ref::RefOptions(64, 2));
    return ref::greedy_run(*b, prompt, steps, go);
  };
  ref::GreedyRun a, b;
  int d = steps;
  for (int attempt = 0; attempt < 8 && d == steps; ++attempt) {  // a prompt whose tokens diverge
    prompt = test::random_tokens(rint(rng, 3, 12), s.vocab_size, rng);
    a = run(wa);
    b = run(wb);
    d = 0;
    while (d < steps && a.tokens[size_t(d)] == b.tokens[size_t(d)]) ++d;
  }
  ASSERT_LT(d, steps) << "negated routers changed no token in " << steps << " steps of 8 prompts";
  const ref::EndToEndComparison c = ref::compare_greedy_runs(a, b, layers);
  EXPECT_EQ(c.first_divergence, d);
  EXPECT_EQ(c.compared_steps, d + 1);
  EXPECT_EQ(c.tokens_a, a.tokens);
  EXPECT_EQ(c.tokens_b, b.tokens);
  auto margin = [](std::vector<float> l) {  // top-1 minus top-2, by sorting
    std::sort(l.rbegin(), l.rend());
    return double(l[0]) - double(l[1]);
  };
  EXPECT_EQ(c.margin_a, margin(a.logits[size_t(d)]));
  EXPECT_EQ(c.margin_b, margin(b.logits[size_t(d)]));
  double max_diff = 0, min_margin = INFINITY;
  for (int i = 0; i <= d; ++i) {
    for (size_t v = 0; v < a.logits[size_t(i)].size(); ++v)
      max_diff = std::max(max_diff, std::fabs(double(a.logits[size_t(i)][v]) - double(b.logits[size_t(i)][v])));
    min_margin = std::min(min_margin, margin(a.logits[size_t(i)]));
  }
  EXPECT_EQ(c.max_logit_diff, max_diff);
  EXPECT_EQ(c.min_margin_a, min_margin);
  EXPECT_EQ(c.expert_sets, int64_t(prompt.size() + size_t(d)) * int64_t(layers.size()));
  EXPECT_GT(c.expert_sets_changed, 0);
  EXPECT_EQ(c.first_set_change_step, 0);         // the prompt's own rows already route differently
  EXPECT_EQ(c.first_set_change_layer, layers[0]);  // on the first MoE layer (its rows are the same in both)
}

}  // namespace
