// moe_forward(): route every token, group (token, choice) pairs by expert, run each hit expert
// once over its tokens (experts in parallel), then combine per token in choice order.
#include "ref/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "ref/linear.h"
#include "ref/mlp.h"

namespace m3::ref {

void router_scores(const float* logits, const float* bias, int num_experts, double* s, double* choice) {
  for (int e = 0; e < num_experts; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    choice[e] = s[e] + double(bias[e]);
  }
}

Route route_through(const float* logits, const std::vector<int32_t>& experts, float routed_scale) {
  Route r;
  std::vector<double> s;
  double sum = 0;
  for (int e : experts) {
    s.push_back(1.0 / (1.0 + std::exp(-double(logits[e]))));
    sum += s.back();
    r.experts.push_back(e);
  }
  for (double v : s) r.weights.push_back(float(v / sum * double(routed_scale)));
  return r;
}

Route route_token(const float* logits, const float* bias, int num_experts, int top_k, float routed_scale) {
  std::vector<double> s(static_cast<size_t>(num_experts)), choice(s.size());
  router_scores(logits, bias, num_experts, s.data(), choice.data());
  std::vector<int> idx(static_cast<size_t>(num_experts));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int a, int b) {
    return choice[size_t(a)] > choice[size_t(b)] || (choice[size_t(a)] == choice[size_t(b)] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), better);
  Route r;
  r.experts.assign(idx.begin(), idx.begin() + top_k);
  double sum = 0;
  for (int e : r.experts) sum += s[size_t(e)];
  for (int e : r.experts) r.weights.push_back(float(s[size_t(e)] / sum * double(routed_scale)));
  return r;
}

namespace {
// The offered list of token t if it is a near-tie of the reference's own route, else the own route
// (a refusal); counts in st.
Route follow_route(const ModelSpec& spec, const LayerWeights& lw, const float* x, const float* logits, Route own,
                   const std::vector<int32_t>& offered, const MoeChoices& mc, int t, FollowStats& st) {
  const int E = spec.num_experts, H = spec.hidden;
  ++st.expert_lists;
  if (offered.size() == own.experts.size() && std::equal(offered.begin(), offered.end(), own.experts.begin()))
    return own;
  ++st.expert_differ;
  const size_t ne = static_cast<size_t>(E);
  std::vector<double> s(ne), choice(ne), mag(ne);
  router_scores(logits, lw.router_bias.data(), E, s.data(), choice.data());
  for (int e = 0; e < E; ++e) {
    const float* w = lw.router.row(e);
    double m = 0;
    for (int h = 0; h < H; ++h) m += std::fabs(double(w[h]) * double(x[h]));
    mag[size_t(e)] = s[size_t(e)] * (1 - s[size_t(e)]) * m;
  }
  const double gap = expert_choice_gap(choice.data(), mag.data(), E, spec.top_k, offered);
  if (gap <= mc.tie_rel) {
    ++st.expert_followed;
    st.expert_max_taken = std::max(st.expert_max_taken, gap);
    return route_through(logits, offered, spec.routed_scale);
  }
  ++st.expert_refused;
  st.expert_min_refused = std::min(st.expert_min_refused, gap);
  if (st.first_refused.empty())
    st.first_refused = fmt::format("layer {} token {}: experts offered [{}], own [{}], relative gap {:.3g}", mc.layer, t,
                                   fmt::join(offered, " "), fmt::join(own.experts, " "), gap);
  return own;
}
}  // namespace

void moe_forward(const ModelSpec& spec, const LayerWeights& lw, const float* x, int n_tok, float* out,
                 ThreadPool& pool, const MoeChoices* mc) {
  const int H = spec.hidden, E = spec.num_experts, K = spec.top_k;
  std::vector<float> logits(size_t(n_tok) * size_t(E));
  linear(lw.router, x, H, n_tok, logits.data(), E, pool);
  const auto* offered = mc ? mc->offered : nullptr;
  M3_CHECK(!offered || (offered->size() == size_t(n_tok) && mc->stats),
           "moe layer {}: {} offered expert lists for {} tokens", mc ? mc->layer : -1, offered ? offered->size() : 0, n_tok);
  std::vector<Route> routes(static_cast<size_t>(n_tok));
  for (int t = 0; t < n_tok; ++t) {
    const float* lg = logits.data() + size_t(t) * E;
    routes[size_t(t)] = route_token(lg, lw.router_bias.data(), E, K, spec.routed_scale);
    if (offered)
      routes[size_t(t)] = follow_route(spec, lw, x + size_t(t) * H, lg, std::move(routes[size_t(t)]),
                                       (*offered)[size_t(t)], *mc, t, *mc->stats);
  }
  if (mc && mc->chosen) {
    mc->chosen->clear();
    for (const Route& r : routes) mc->chosen->emplace_back(r.experts.begin(), r.experts.end());
  }

  // tokens of each expert, in token order; task E is the shared expert over all tokens
  std::vector<std::vector<int>> toks(static_cast<size_t>(E));
  for (int t = 0; t < n_tok; ++t)
    for (int e : routes[size_t(t)].experts) toks[size_t(e)].push_back(t);
  std::vector<int> tasks;
  for (int e = 0; e < E; ++e)
    if (!toks[size_t(e)].empty()) tasks.push_back(e);
  bool shared = !lw.shared.gate.empty();
  if (shared) tasks.push_back(E);

  // outputs of each (expert, its token list index); shared: one row per token
  std::vector<std::vector<float>> res(size_t(E) + 1);
  pool.parallel_for(
      int64_t(tasks.size()),
      [&](int64_t b, int64_t e_) {
        for (int64_t ti = b; ti < e_; ++ti) {
          int e = tasks[size_t(ti)];
          const MlpWeights& w = e == E ? lw.shared : lw.experts[size_t(e)];
          std::vector<float> xin;
          const float* src = x;
          int n = n_tok;
          if (e != E) {
            n = int(toks[size_t(e)].size());
            xin.resize(size_t(n) * size_t(H));
            for (int i = 0; i < n; ++i)
              std::copy_n(x + size_t(toks[size_t(e)][size_t(i)]) * H, H, xin.data() + size_t(i) * H);
            src = xin.data();
          }
          res[size_t(e)].resize(size_t(n) * size_t(H));
          // nested: the linears inside run inline on this thread
          mlp_forward(w, src, n, spec.swiglu_alpha, spec.swiglu_limit, res[size_t(e)].data(), pool);
        }
      },
      1);

  // combine in fixed order: shared first, then choices best-first
  std::vector<size_t> cursor(size_t(E), 0);  // next unread row of each expert's output
  std::vector<double> acc(static_cast<size_t>(H));
  for (int t = 0; t < n_tok; ++t) {
    if (shared)
      for (int h = 0; h < H; ++h) acc[size_t(h)] = res[size_t(E)][size_t(t) * H + h];
    else
      std::fill(acc.begin(), acc.end(), 0.0);
    const Route& r = routes[size_t(t)];
    for (int k = 0; k < K; ++k) {
      int e = r.experts[size_t(k)];
      const float* row = res[size_t(e)].data() + cursor[size_t(e)]++ * size_t(H);
      double w = r.weights[size_t(k)];
      for (int h = 0; h < H; ++h) acc[size_t(h)] += w * double(row[h]);
    }
    for (int h = 0; h < H; ++h) out[size_t(t) * H + h] = float(acc[size_t(h)]);
  }
}

}  // namespace m3::ref
