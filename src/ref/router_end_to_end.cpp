#include "ref/router_end_to_end.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ref/engine.h"
#include "ref/router_probe.h"

namespace m3::ref {

namespace {
std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace

EndToEndComparison compare_greedy_runs(const GreedyRun& a, const GreedyRun& b, const std::vector<int>& layers) {
  const size_t n = a.tokens.size();
  M3_CHECK(n >= 1 && b.tokens.size() == n, "compare_greedy_runs: runs of {} and {} steps", n, b.tokens.size());
  M3_CHECK(a.logits.size() == n && b.logits.size() == n && a.traces.size() == n && b.traces.size() == n,
           "compare_greedy_runs: both runs need their logits and traces");
  EndToEndComparison c;
  c.steps = int(n);
  c.tokens_a = a.tokens;
  c.tokens_b = b.tokens;
  for (size_t i = 0; i < n; ++i) {
    const auto& la = a.logits[i];
    const auto& lb = b.logits[i];
    M3_CHECK(la.size() == lb.size(), "compare_greedy_runs: step {}: {} and {} logits", i, la.size(), lb.size());
    for (size_t v = 0; v < la.size(); ++v) c.max_logit_diff = std::max(c.max_logit_diff, std::fabs(double(la[v]) - double(lb[v])));
    c.min_margin_a = std::min(c.min_margin_a, a.margins[i]);
    const SelectionTrace& ta = a.traces[i];
    const SelectionTrace& tb = b.traces[i];
    for (int l : layers) {
      auto ia = std::find(ta.moe_layers.begin(), ta.moe_layers.end(), l);
      auto ib = std::find(tb.moe_layers.begin(), tb.moe_layers.end(), l);
      M3_CHECK(ia != ta.moe_layers.end() && ib != tb.moe_layers.end(), "compare_greedy_runs: step {}: no experts traced for layer {}", i, l);
      const auto& ea = ta.experts[size_t(ia - ta.moe_layers.begin())];
      const auto& eb = tb.experts[size_t(ib - tb.moe_layers.begin())];
      M3_CHECK(ea.size() == eb.size(), "compare_greedy_runs: step {} layer {}: {} and {} tokens", i, l, ea.size(), eb.size());
      for (size_t t = 0; t < ea.size(); ++t) {
        ++c.expert_sets;
        if (sorted(ea[t]) != sorted(eb[t])) {
          ++c.expert_sets_changed;
          if (c.first_set_change_step < 0) {
            c.first_set_change_step = int(i);
            c.first_set_change_layer = l;
          }
        }
      }
    }
    c.compared_steps = int(i) + 1;
    if (a.tokens[i] != b.tokens[i]) {
      c.first_divergence = int(i);
      c.margin_a = a.margins[i];
      c.margin_b = b.margins[i];
      break;
    }
  }
  return c;
}

void round_routers_to_bf16(const ModelSpec& spec, ModelWeights& w) {
  for (int l = 0; l < spec.num_layers; ++l)
    if (spec.moe(l)) w.layers[size_t(l)].router = round_to_bf16(w.layers[size_t(l)].router);
}

EndToEndComparison router_end_to_end(const ModelSpec& spec, const std::function<ModelWeights()>& load,
                                     const std::vector<int32_t>& prompt, int steps, const std::vector<int>& layers,
                                     const EndToEndOptions& opt) {
  M3_CHECK(steps >= 1, "router end-to-end: steps must be >= 1, got {}", steps);
  const int64_t positions = greedy_positions(prompt.size(), steps);
  const int blocks = int((positions + spec.index_block - 1) / spec.index_block);
  auto run = [&](char which) {
    ModelWeights w = load();
    if (which == 'B') round_routers_to_bf16(spec, w);
    auto b = make_ref_backend(spec, std::move(w), RefOptions(blocks, opt.threads));
    GreedyOptions go;
    go.keep_logits = go.keep_traces = true;
    if (opt.progress) go.progress = [&](int s, int n) { opt.progress(which, s, n); };
    return greedy_run(*b, prompt, steps, go);
  };
  GreedyRun a = run('A');
  GreedyRun b = run('B');
  return compare_greedy_runs(a, b, layers);
}

}  // namespace m3::ref
