// moe_forward(): route every token, group (token, choice) pairs by expert, run each hit expert
// once over its tokens (experts in parallel), then combine per token in choice order.
#include "ref/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ref/linear.h"
#include "ref/mlp.h"

namespace m3::ref {

Route route_token(const float* logits, const float* bias, int num_experts, int top_k, float routed_scale) {
  std::vector<double> s(static_cast<size_t>(num_experts)), choice(s.size());
  for (int e = 0; e < num_experts; ++e) {
    s[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    choice[size_t(e)] = s[size_t(e)] + double(bias[e]);
  }
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

void moe_forward(const ModelSpec& spec, const LayerWeights& lw, const float* x, int n_tok, float* out,
                 ThreadPool& pool) {
  const int H = spec.hidden, E = spec.num_experts, K = spec.top_k;
  std::vector<float> logits(size_t(n_tok) * size_t(E));
  linear(lw.router, x, H, n_tok, logits.data(), E, pool);
  std::vector<Route> routes(static_cast<size_t>(n_tok));
  for (int t = 0; t < n_tok; ++t)
    routes[size_t(t)] = route_token(logits.data() + size_t(t) * E, lw.router_bias.data(), E, K, spec.routed_scale);

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
