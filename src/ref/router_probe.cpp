// compare_routers: logits of both routers with ref::linear, then per row ref::route_token (with
// routed_scale 1, so the weights are the renormalized ones) and ref::router_scores for the margin.
#include "ref/router_probe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/codecs.h"
#include "ref/linear.h"
#include "ref/moe.h"

namespace m3::ref {

Mat round_to_bf16(const Mat& w) {
  Mat r = w;
  for (float& v : r.data) v = bf16_to_f32(f32_to_bf16(v));
  return r;
}

int64_t count_bf16_inexact(const Mat& w) {
  int64_t n = 0;
  for (float v : w.data) n += bf16_to_f32(f32_to_bf16(v)) != v;
  return n;
}

namespace {
// Largest |a_e - b_e| over the union of two routes, an expert absent from a route weighing 0.
double route_weight_diff(const Route& a, const Route& b) {
  double worst = 0;
  auto weight_in = [](const Route& r, int e) {
    for (size_t k = 0; k < r.experts.size(); ++k)
      if (r.experts[k] == e) return double(r.weights[k]);
    return 0.0;
  };
  for (const Route* r : {&a, &b})
    for (int e : r->experts) worst = std::max(worst, std::fabs(weight_in(a, e) - weight_in(b, e)));
  return worst;
}

bool same_set(std::vector<int> a, std::vector<int> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}
}  // namespace

RouterComparison compare_routers(const Mat& wa, const Mat& wb, const Vec& bias, int top_k, const float* x, int n_rows,
                                 double weight_tol, ThreadPool& pool) {
  const int E = wa.rows, H = wa.cols;
  M3_CHECK(wb.rows == E && wb.cols == H, "compare_routers: weights of [{}, {}] and [{}, {}]", wa.rows, wa.cols, wb.rows,
           wb.cols);
  M3_CHECK(E > 0 && int(bias.size()) == E, "compare_routers: {} experts, {} correction biases", E, bias.size());
  M3_CHECK(top_k >= 1 && top_k <= E, "compare_routers: top_k {} outside [1, {}]", top_k, E);
  M3_CHECK(n_rows >= 0, "compare_routers: {} rows", n_rows);
  M3_CHECK(weight_tol > 0 && std::isfinite(weight_tol), "compare_routers: weight threshold must be > 0, got {}",
           weight_tol);
  std::vector<float> la(size_t(n_rows) * size_t(E)), lb(la.size());
  linear(wa, x, H, n_rows, la.data(), E, pool);
  linear(wb, x, H, n_rows, lb.data(), E, pool);

  RouterComparison c;
  c.rows = n_rows;
  c.min_margin = std::numeric_limits<double>::infinity();
  c.per_row.resize(size_t(n_rows));
  std::vector<double> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  for (int r = 0; r < n_rows; ++r) {
    const float* ra = la.data() + size_t(r) * E;
    const float* rb = lb.data() + size_t(r) * E;
    Route a = route_token(ra, bias.data(), E, top_k, 1.0f);
    Route b = route_token(rb, bias.data(), E, top_k, 1.0f);
    RouterRowDiff& d = c.per_row[size_t(r)];
    for (int e = 0; e < E; ++e) d.max_logit_diff = std::max(d.max_logit_diff, std::fabs(double(ra[e]) - double(rb[e])));
    router_scores(ra, bias.data(), E, s.data(), choice.data());
    double left_out = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e)
      if (std::find(a.experts.begin(), a.experts.end(), e) == a.experts.end()) left_out = std::max(left_out, choice[size_t(e)]);
    d.margin_a = choice[size_t(a.experts.back())] - left_out;  // +inf when every expert is chosen
    d.max_weight_diff = route_weight_diff(a, b);
    d.set_changed = !same_set(a.experts, b.experts);
    d.experts_a = std::move(a.experts);
    d.experts_b = std::move(b.experts);
    d.weights_a = std::move(a.weights);
    d.weights_b = std::move(b.weights);

    c.sets_changed += d.set_changed;
    c.weights_changed += d.max_weight_diff > weight_tol;
    c.max_logit_diff = std::max(c.max_logit_diff, d.max_logit_diff);
    c.max_weight_diff = std::max(c.max_weight_diff, d.max_weight_diff);
    if (d.margin_a < c.min_margin) {
      c.min_margin = d.margin_a;
      c.min_margin_row = r;
    }
  }
  return c;
}

RouterLayerProbe probe_router_rounding(const LayerWeights& lw, int layer, int top_k, const float* x, int n_rows,
                                       double weight_tol, ThreadPool& pool) {
  M3_CHECK(!lw.router.empty(), "router probe: layer {} has no router (a dense layer)", layer);
  RouterLayerProbe p;
  p.layer = layer;
  p.weight_elements = int64_t(lw.router.data.size());
  p.bf16_inexact = count_bf16_inexact(lw.router);
  p.cmp = compare_routers(lw.router, round_to_bf16(lw.router), lw.router_bias, top_k, x, n_rows, weight_tol, pool);
  return p;
}

}  // namespace m3::ref
