// Each operation of the CPU reference against a plain float64 formula written here: Gemma norm,
// partial NeoX RoPE, SwiGLU-OAI, linear, attention over a slot list, indexer scoring / max-pool /
// block selection (ties, -inf, NaN, forced local blocks), router top-k and renormalisation, the MLP
// and the MoE layer. Inputs are drawn fresh each run (seed printed on failure), outputs are
// poisoned with NaN before each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "common/compare.h"
#include "common/random.h"
#include "core/parallel.h"
#include "ref/attention.h"
#include "ref/indexer.h"
#include "ref/linear.h"
#include "ref/mlp.h"
#include "ref/moe.h"
#include "ref/norm.h"
#include "ref/rope.h"

using namespace m3;
using namespace m3::ref;
using m3::test::fresh_seed;
using m3::test::random_vector;

namespace {
std::vector<float> poisoned(size_t n) { return std::vector<float>(n, NAN); }
std::vector<float> to_float(const std::vector<double>& d) { return {d.begin(), d.end()}; }
int rint(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
}  // namespace

TEST(RefOps, GemmaNorm) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 50; ++rep) {
    int n = rint(rng, 1, 300);
    float scale = std::pow(10.0f, float(rint(rng, -3, 3)));
    auto x = random_vector(size_t(n), rng, scale), w = random_vector(size_t(n), rng, 0.5f);
    float eps = rep % 2 ? 1e-6f : 1e-2f;
    std::vector<double> ref(static_cast<size_t>(n));
    double ms = 0;
    for (float v : x) ms += double(v) * v;
    ms /= n;
    for (int i = 0; i < n; ++i) ref[size_t(i)] = x[size_t(i)] / std::sqrt(ms + double(eps)) * (1.0 + w[size_t(i)]);
    auto y = poisoned(static_cast<size_t>(n));
    gemma_rms_norm(x.data(), w.data(), n, eps, y.data());
    // only the final rounding to fp32 differs from the fp64 formula: 0.5 ulp = 6e-8 relative (+ slack)
    EXPECT_CLOSE(y, to_float(ref), 0.0, 2.5e-7);
    gemma_rms_norm(x.data(), w.data(), n, eps, x.data());  // in place gives the same bits
    EXPECT_EQ(x, y);
  }
}

TEST(RefOps, RopeMatchesFp64Formula) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 40; ++rep) {
    int hd = 2 * rint(rng, 1, 64), rd = 2 * rint(rng, 0, hd / 2);
    double theta = rep % 2 ? 5e6 : 1e4;
    int pos = rep < 5 ? rep : rint(rng, 0, 4096);
    auto x = random_vector(size_t(hd), rng);
    std::vector<double> ref(x.begin(), x.end());
    int r = rd / 2;
    for (int i = 0; i < r; ++i) {
      double a = pos * std::pow(theta, -2.0 * i / rd);
      ref[size_t(i)] = x[size_t(i)] * std::cos(a) - x[size_t(i + r)] * std::sin(a);
      ref[size_t(i + r)] = x[size_t(i + r)] * std::cos(a) + x[size_t(i)] * std::sin(a);
    }
    auto y = x;
    Rope(rd, theta).apply(y.data(), pos);
    double mx = 0;
    for (float v : x) mx = std::max(mx, double(std::fabs(v)));
    // the angle is formed in fp32 (project convention, see rope.h): its error is up to ~1.5 ulp of
    // pos * inv_freq, i.e. ~2e-7 * pos radians, times |x|; plus fp32 rounding of cos/sin and y
    SCOPED_TRACE("hd " + std::to_string(hd) + " rd " + std::to_string(rd) + " pos " + std::to_string(pos));
    EXPECT_CLOSE(y, to_float(ref), mx * (4e-7 + 2.5e-7 * pos), 0.0);
    for (int i = rd; i < hd; ++i) EXPECT_EQ(y[size_t(i)], x[size_t(i)]) << "channel " << i << " must pass through";
    if (pos == 0) {
      EXPECT_EQ(y, x) << "position 0 is the identity";
    }
  }
}

TEST(RefOps, RopeUsesFp32AngleConvention) {
  // at long positions the fp32 angle differs from the fp64 one by far more than rounding; the golden
  // fixtures (transformers) and vLLM use the fp32 angle, so the reference must too
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rd = 64;
  const double theta = 5e6;
  for (int rep = 0; rep < 20; ++rep) {
    int pos = rint(rng, 100000, 1000000);
    auto x = random_vector(size_t(rd), rng);
    std::vector<double> ref(x.begin(), x.end());
    for (int i = 0; i < rd / 2; ++i) {
      float inv = 1.0f / float(std::pow(theta, double(float(2 * i) / float(rd))));
      double a = double(float(pos) * inv);
      ref[size_t(i)] = x[size_t(i)] * std::cos(a) - x[size_t(i + rd / 2)] * std::sin(a);
      ref[size_t(i + rd / 2)] = x[size_t(i + rd / 2)] * std::cos(a) + x[size_t(i)] * std::sin(a);
    }
    auto y = x;
    Rope(rd, theta).apply(y.data(), pos);
    // fp32 rounding of cos/sin (6e-8) and of the outputs, relative to |x| ~ 1..4
    SCOPED_TRACE("pos " + std::to_string(pos));
    EXPECT_CLOSE(y, to_float(ref), 1e-6, 0.0);
  }
}

TEST(RefOps, SwigluOai) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-12.f, 12.f);
  const float alpha = 1.702f, limit = 7.0f;
  std::vector<float> got, ref;
  for (int i = 0; i < 5000; ++i) {
    float g = u(rng), up = u(rng);
    double gg = std::min<double>(g, limit), uu = std::clamp<double>(up, -limit, limit);
    ref.push_back(float((uu + 1) * gg * (1 / (1 + std::exp(-double(alpha) * gg)))));
    got.push_back(swiglu_oai(g, up, alpha, limit));
  }
  EXPECT_CLOSE(got, ref, 0.0, 1e-7);  // computed in double, rounded once: identical up to one rounding
  // the clamps: gate only from above, up on both sides; h(gate=limit, up=limit) is the largest output
  EXPECT_EQ(swiglu_oai(100.f, 3.f, alpha, limit), swiglu_oai(limit, 3.f, alpha, limit));
  EXPECT_NE(swiglu_oai(-100.f, 3.f, alpha, limit), swiglu_oai(-limit, 3.f, alpha, limit));
  EXPECT_EQ(swiglu_oai(2.f, 50.f, alpha, limit), swiglu_oai(2.f, limit, alpha, limit));
  EXPECT_EQ(swiglu_oai(2.f, -50.f, alpha, limit), swiglu_oai(2.f, -limit, alpha, limit));
  EXPECT_EQ(swiglu_oai(2.f, -1.f, alpha, limit), 0.0f);  // (u + 1) factor
}

TEST(RefOps, LinearAndThreadCountIndependence) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int rows = rint(rng, 1, 300), cols = rint(rng, 1, 200), nt = rint(rng, 1, 9);
  Mat w(rows, cols);
  m3::test::fill_normal(w.data, rng, 1.0f);
  auto x = random_vector(size_t(nt) * cols, rng);
  std::vector<double> ref(size_t(nt) * rows);
  for (int t = 0; t < nt; ++t)
    for (int o = 0; o < rows; ++o) {
      double s = 0;
      for (int i = 0; i < cols; ++i) s += double(w.row(o)[i]) * x[size_t(t) * cols + i];
      ref[size_t(t) * rows + o] = s;
    }
  ThreadPool p1(1), p3(3);
  auto y1 = poisoned(ref.size()), y3 = poisoned(ref.size());
  linear(w, x.data(), cols, nt, y1.data(), rows, p1);
  linear(w, x.data(), cols, nt, y3.data(), rows, p3);
  // double accumulation, one rounding at the end; the summation order differs from the plain loop
  // by a few ulp of the double sum, far below fp32 resolution of the |terms|
  double mx = 0;
  for (double v : ref) mx = std::max(mx, std::fabs(v));
  EXPECT_CLOSE(y1, to_float(ref), 1e-12 * mx * cols, 1e-7);
  EXPECT_EQ(y1, y3) << "thread count changed the result";
  // one token alone equals the same token inside a batch (batch invariance)
  auto y_one = poisoned(static_cast<size_t>(rows));
  linear(w, x.data() + size_t(nt - 1) * cols, cols, 1, y_one.data(), rows, p3);
  EXPECT_TRUE(std::equal(y_one.begin(), y_one.end(), y1.begin() + ptrdiff_t(size_t(nt - 1) * rows)));
}

TEST(RefOps, AttentionOverSlotList) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 30; ++rep) {
    int dim = rint(rng, 1, 64), nslots = rint(rng, 1, 80), stride = dim + rint(rng, 0, 5);
    int n = rint(rng, 1, nslots);
    auto kc = random_vector(size_t(nslots) * stride, rng, 2.0f), vc = random_vector(size_t(nslots) * stride, rng);
    auto q = random_vector(size_t(dim), rng, 2.0f);
    std::vector<int64_t> slots(static_cast<size_t>(nslots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(static_cast<size_t>(n));
    double scale = 1 / std::sqrt(double(dim));
    std::vector<double> s(static_cast<size_t>(n)), ref(size_t(dim), 0.0);
    double m = -INFINITY, z = 0;
    for (int j = 0; j < n; ++j) {
      double d = 0;
      for (int i = 0; i < dim; ++i) d += double(q[size_t(i)]) * kc[size_t(slots[size_t(j)] * stride + i)];
      s[size_t(j)] = d * scale;
      m = std::max(m, s[size_t(j)]);
    }
    for (int j = 0; j < n; ++j) z += std::exp(s[size_t(j)] - m);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < dim; ++i)
        ref[size_t(i)] += std::exp(s[size_t(j)] - m) / z * vc[size_t(slots[size_t(j)] * stride + i)];
    auto out = poisoned(static_cast<size_t>(dim));
    attend_head(q.data(), kc.data(), vc.data(), stride, slots.data(), n, dim, scale, out.data());
    // all in double inside, one rounding to fp32 at the end; atol covers outputs that cancel to ~0
    SCOPED_TRACE("dim " + std::to_string(dim) + " n " + std::to_string(n));
    EXPECT_CLOSE(out, to_float(ref), 1e-7, 1e-6);
  }
}

TEST(RefOps, IndexScoresAndMaxPool) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 30; ++rep) {
    int dim = rint(rng, 1, 64), n = rint(rng, 1, 100), block = rint(rng, 1, 16), stride = dim + 3;
    auto ik = random_vector(size_t(n) * stride, rng), iq = random_vector(size_t(dim), rng);
    std::vector<int64_t> slots(static_cast<size_t>(n));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<double> ref(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < dim; ++i) ref[size_t(j)] += double(iq[size_t(i)]) * ik[size_t(slots[size_t(j)] * stride + i)];
    auto sc = poisoned(static_cast<size_t>(n));
    index_scores(iq.data(), ik.data(), stride, slots.data(), n, dim, sc.data());
    EXPECT_CLOSE(sc, to_float(ref), 1e-12, 1e-7);  // no scale; fp32 result of a double dot
    auto pooled = block_max_pool(sc.data(), n, block);
    ASSERT_EQ(int(pooled.size()), (n + block - 1) / block);
    for (int b = 0; b < int(pooled.size()); ++b) {
      float mx = -INFINITY;
      for (int j = b * block; j < std::min(n, (b + 1) * block); ++j) mx = std::max(mx, sc[size_t(j)]);
      EXPECT_EQ(pooled[size_t(b)], mx) << "block " << b;
    }
  }
}

namespace {
// brute force of the selection rule: forced blocks +inf, sort by (score desc, id asc), keep
// min(topk, nb), drop -inf / NaN
std::vector<int32_t> brute_select(std::vector<float> s, int qb, int topk, int local) {
  int nb = int(s.size());
  for (int i = 0; i < local && qb - i >= 0; ++i)
    if (qb - i < nb) s[size_t(qb - i)] = INFINITY;
  std::vector<std::pair<double, int>> v;
  for (int b = 0; b < nb; ++b) v.emplace_back(std::isnan(s[size_t(b)]) ? INFINITY : -double(s[size_t(b)]), b);
  std::sort(v.begin(), v.end());
  std::vector<int32_t> out;
  for (int i = 0; i < std::min(topk, nb); ++i)
    if (v[size_t(i)].first != INFINITY) out.push_back(v[size_t(i)].second);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST(RefOps, SelectBlocksRandomTiesAndInfinities) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 500; ++rep) {
    int nb = rint(rng, 1, 20), topk = rint(rng, 1, 8), local = rint(rng, 0, 3), qb = rint(rng, 0, nb - 1);
    std::vector<float> s(static_cast<size_t>(nb));
    for (auto& x : s) {
      int kind = rint(rng, 0, 9);
      // few distinct values so ties are common; some -inf and NaN
      x = kind == 0 ? -INFINITY : kind == 1 ? NAN : float(rint(rng, -3, 3));
    }
    auto got = select_blocks(s.data(), nb, qb, topk, local);
    EXPECT_EQ(got, brute_select(s, qb, topk, local)) << "nb " << nb << " qb " << qb << " topk " << topk << " local " << local;
    for (int32_t b : got) EXPECT_FALSE(s[size_t(b)] == -INFINITY && (qb - b >= local || b > qb)) << "-inf block kept";
  }
}

TEST(RefOps, SelectBlocksEdges) {
  std::vector<float> eq(8, 1.0f);
  // all equal: the query block forced, then the lowest ids
  EXPECT_EQ(select_blocks(eq.data(), 8, 7, 3, 1), (std::vector<int32_t>{0, 1, 7}));
  // two local blocks at block 0: clamped, only block 0 forced
  EXPECT_EQ(select_blocks(eq.data(), 1, 0, 4, 2), (std::vector<int32_t>{0}));
  // fewer blocks than topk: all kept
  std::vector<float> s{0.5f, -2.f, 3.f};
  EXPECT_EQ(select_blocks(s.data(), 3, 2, 16, 1), (std::vector<int32_t>{0, 1, 2}));
  // -inf never kept even when there is room
  std::vector<float> si{-INFINITY, 2.f, -INFINITY, 1.f};
  EXPECT_EQ(select_blocks(si.data(), 4, 3, 4, 1), (std::vector<int32_t>{1, 3}));
  // forced local blocks win over larger scores
  std::vector<float> sl{9.f, 8.f, 7.f, 0.f, -1.f};
  EXPECT_EQ(select_blocks(sl.data(), 5, 4, 3, 2), (std::vector<int32_t>{0, 3, 4}));
  // the tie at the cut goes to the lower block index
  std::vector<float> st{1.f, 5.f, 5.f, 5.f, 0.f};
  EXPECT_EQ(select_blocks(st.data(), 5, 4, 3, 1), (std::vector<int32_t>{1, 2, 4}));
}

TEST(RefOps, RouterTopKRenormalised) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 200; ++rep) {
    int E = rint(rng, 1, 40), K = rint(rng, 1, E);
    float scale = rep % 2 ? 2.0f : 1.0f;
    auto lg = random_vector(size_t(E), rng, 2.0f), bias = random_vector(size_t(E), rng, 0.1f);
    if (rep % 5 == 0)  // ties in the choice score
      for (int e = 0; e < E; ++e) { lg[size_t(e)] = float(rint(rng, 0, 2)); bias[size_t(e)] = 0; }
    Route r = route_token(lg.data(), bias.data(), E, K, scale);
    std::vector<std::pair<double, int>> v;
    for (int e = 0; e < E; ++e) v.emplace_back(-(1 / (1 + std::exp(-double(lg[size_t(e)]))) + bias[size_t(e)]), e);
    std::sort(v.begin(), v.end());
    std::vector<int> want;
    for (int i = 0; i < K; ++i) want.push_back(v[size_t(i)].second);
    EXPECT_EQ(r.experts, want);
    double sum = 0;
    for (int e : want) sum += 1 / (1 + std::exp(-double(lg[size_t(e)])));
    std::vector<float> ref;
    for (int e : want) ref.push_back(float(1 / (1 + std::exp(-double(lg[size_t(e)]))) / sum * scale));
    EXPECT_CLOSE(r.weights, ref, 0.0, 1e-7);  // double inside, one fp32 rounding
  }
  // the bias only chooses: expert 1 chosen through its bias, weighted by its own sigmoid alone
  std::vector<float> lg{2.f, -2.f, 0.f}, b{0.f, 1.f, 0.f};
  Route r = route_token(lg.data(), b.data(), 3, 2, 1.0f);
  ASSERT_EQ(r.experts, (std::vector<int>{1, 0}));
  double s0 = 1 / (1 + std::exp(-2.0)), s1 = 1 / (1 + std::exp(2.0));
  EXPECT_FLOAT_EQ(r.weights[0], float(s1 / (s0 + s1)));
  EXPECT_FLOAT_EQ(r.weights[1], float(s0 / (s0 + s1)));
}

namespace {
std::vector<double> naive_mlp(const MlpWeights& w, const float* x, float alpha, float limit) {
  std::vector<double> h(size_t(w.gate.rows)), out(size_t(w.down.rows), 0.0);
  for (int i = 0; i < w.gate.rows; ++i) {
    double g = 0, u = 0;
    for (int j = 0; j < w.gate.cols; ++j) {
      g += double(w.gate.row(i)[j]) * x[j];
      u += double(w.up.row(i)[j]) * x[j];
    }
    g = std::min(g, double(limit));
    u = std::clamp(u, -double(limit), double(limit));
    h[size_t(i)] = (u + 1) * g / (1 + std::exp(-double(alpha) * g));
  }
  for (int o = 0; o < w.down.rows; ++o)
    for (int i = 0; i < w.down.cols; ++i) out[size_t(o)] += double(w.down.row(o)[i]) * h[size_t(i)];
  return out;
}
}  // namespace

TEST(RefOps, MlpAndMoeLayer) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  s.shared_inter = rng() % 2 ? s.shared_inter : 0;
  ModelWeights w = m3::test::make_random_weights(s, rng());
  const LayerWeights& L = w.layers[1];
  int T = rint(rng, 1, 7), H = s.hidden;
  auto x = random_vector(size_t(T) * H, rng);
  ThreadPool pool(2);
  auto out = poisoned(size_t(T) * H), dense = poisoned(size_t(T) * H);
  moe_forward(s, L, x.data(), T, out.data(), pool);
  mlp_forward(w.layers[0].dense, x.data(), T, s.swiglu_alpha, s.swiglu_limit, dense.data(), pool);
  std::vector<double> ref(size_t(T) * H, 0.0), dref;
  for (int t = 0; t < T; ++t) {
    const float* xt = x.data() + size_t(t) * H;
    auto d = naive_mlp(w.layers[0].dense, xt, s.swiglu_alpha, s.swiglu_limit);
    dref.insert(dref.end(), d.begin(), d.end());
    std::vector<double> sg(size_t(s.num_experts)), ch(sg.size());
    for (int e = 0; e < s.num_experts; ++e) {
      double r = 0;
      for (int j = 0; j < H; ++j) r += double(L.router.row(e)[j]) * xt[j];
      sg[size_t(e)] = 1 / (1 + std::exp(-r));
      ch[size_t(e)] = sg[size_t(e)] + L.router_bias[size_t(e)];
    }
    std::vector<int> ord(sg.size());
    std::iota(ord.begin(), ord.end(), 0);
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return ch[size_t(a)] > ch[size_t(b)]; });
    double sum = 0;
    for (int k = 0; k < s.top_k; ++k) sum += sg[size_t(ord[size_t(k)])];
    for (int k = 0; k < s.top_k; ++k) {
      auto eo = naive_mlp(L.experts[size_t(ord[size_t(k)])], xt, s.swiglu_alpha, s.swiglu_limit);
      for (int j = 0; j < H; ++j) ref[size_t(t) * H + j] += sg[size_t(ord[size_t(k)])] / sum * s.routed_scale * eo[size_t(j)];
    }
    if (s.shared_inter > 0) {
      auto so = naive_mlp(L.shared, xt, s.swiglu_alpha, s.swiglu_limit);
      for (int j = 0; j < H; ++j) ref[size_t(t) * H + j] += so[size_t(j)];  // shared: not scaled
    }
  }
  // fp32 rounding of the router logits, gate/up projections and h (each ~6e-8 relative), carried
  // through the down projection: a few 1e-7 of the output scale (~1)
  EXPECT_CLOSE(dense, to_float(dref), 2e-6, 2e-6);
  EXPECT_CLOSE(out, to_float(ref), 2e-6, 2e-6);
  // a token's output does not depend on the other tokens of the batch
  auto one = poisoned(static_cast<size_t>(H));
  moe_forward(s, L, x.data() + size_t(T - 1) * H, 1, one.data(), pool);
  EXPECT_TRUE(std::equal(one.begin(), one.end(), out.begin() + ptrdiff_t(size_t(T - 1) * H)));
}
