// run_conformance(): one all-logits prefill per prompt (with the selection trace), then one decode
// step per golden greedy token.
#include "ref/conformance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "runtime/sampler.h"

namespace m3::ref {

bool ConformanceReport::ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const ConformanceCheck& c) { return c.ok; });
}

namespace {

// got/ref: rows x vocab
ConformanceCheck check_logits(std::string name, const float* got, const float* ref, int rows, int vocab, double tol) {
  ConformanceCheck c{std::move(name), true, 0, ""};
  int wr = -1, wc = 0;
  double wabs = 0, wmax = 0;
  for (int r = 0; r < rows; ++r) {
    const float* g = got + size_t(r) * vocab;
    const float* f = ref + size_t(r) * vocab;
    double mx = 0, md = 0;
    int col = 0;
    for (int v = 0; v < vocab; ++v) {
      mx = std::max(mx, double(std::fabs(f[v])));
      double d = std::fabs(double(g[v]) - double(f[v]));
      if (!(d <= md)) {  // NaN in got counts as the worst
        md = std::isnan(d) ? INFINITY : d;
        col = v;
      }
    }
    double ratio = mx > 0 ? md / mx : md;
    if (wr < 0 || ratio > c.worst) {
      c.worst = ratio;
      wr = r;
      wc = col;
      wabs = md;
      wmax = mx;
    }
  }
  c.ok = c.worst <= tol;
  c.detail = fmt::format("{} rows; worst row {} col {}: got {:.7g} ref {:.7g}, |d| {:.3g}, max|ref| {:.4g}, "
                         "max|d|/max|ref| {:.3g} (bound {:g})",
                         rows, wr, wc, got[size_t(wr) * vocab + wc], ref[size_t(wr) * vocab + wc], wabs, wmax, c.worst,
                         tol);
  return c;
}

std::string set_str(const std::vector<int32_t>& v) { return fmt::format("{{{}}}", fmt::join(v, ",")); }

ConformanceCheck check_blocks(const std::string& name, const GoldenPrompt& g, const SelectionTrace& tr) {
  ConformanceCheck c{name, true, 0, ""};
  int bad = 0, rows = 0;
  std::string first;
  auto note = [&](std::string s) {
    ++bad;
    if (first.empty()) first = std::move(s);
  };
  for (size_t i = 0; i < tr.layers.size(); ++i)
    if (!g.prefill_blocks.count(tr.layers[i])) note(fmt::format("engine layer {} is sparse, golden has no selection for it", tr.layers[i]));
  for (const auto& [layer, gb] : g.prefill_blocks) {
    auto it = std::find(tr.layers.begin(), tr.layers.end(), layer);
    if (it == tr.layers.end()) {
      note(fmt::format("golden layer {} has selections, the engine traced none (not a sparse layer?)", layer));
      continue;
    }
    const auto& eng = tr.blocks[size_t(it - tr.layers.begin())];
    if (int(eng.size()) != gb.tokens || (gb.tokens > 0 && int(eng[0].size()) != gb.heads)) {
      note(fmt::format("layer {}: engine traced {} tokens x {} groups, golden has {} x {}", layer, eng.size(),
                       eng.empty() ? 0 : eng[0].size(), gb.tokens, gb.heads));
      continue;
    }
    for (int h = 0; h < gb.heads; ++h)
      for (int t = 0; t < gb.tokens; ++t) {
        ++rows;
        std::vector<int32_t> want;
        for (int j = 0; j < gb.k; ++j)
          if (gb.row(h, t)[j] >= 0) want.push_back(gb.row(h, t)[j]);
        std::sort(want.begin(), want.end());
        std::vector<int32_t> got = eng[size_t(t)][size_t(h)];
        std::sort(got.begin(), got.end());
        if (got != want) note(fmt::format("layer {} group {} token {}: engine {} golden {}", layer, h, t, set_str(got), set_str(want)));
      }
  }
  c.ok = bad == 0;
  c.worst = bad;
  c.detail = bad == 0 ? fmt::format("{} layers, {} (group, token) rows equal as sets", g.prefill_blocks.size(), rows)
                      : fmt::format("{} of {} rows differ; first: {}", bad, rows, first);
  return c;
}

}  // namespace

ConformanceReport run_conformance(Backend& b, const std::vector<GoldenPrompt>& golden, const ConformanceOptions& opt,
                                  const std::function<void(const ConformanceCheck&)>& on_check) {
  ConformanceReport rep;
  auto add = [&](ConformanceCheck c) {
    if (on_check) on_check(c);
    rep.checks.push_back(std::move(c));
  };
  const int V = b.spec().vocab_size, bs = b.cache_block_size();
  for (const GoldenPrompt& g : golden) {
    const std::string p = fmt::format("p{} ({} tokens + {} steps)", g.index, g.tokens(), g.steps());
    M3_CHECK(g.vocab == V, "conformance: golden prompt {} has vocabulary {}, the model {}", g.index, g.vocab, V);
    const int total = g.tokens() + std::max(0, g.steps() - 1);
    const int nb = (total + bs - 1) / bs;
    M3_CHECK(nb <= b.num_cache_blocks(), "conformance: prompt {} needs {} cache blocks, the backend has {}", g.index, nb,
             b.num_cache_blocks());
    std::vector<int32_t> table(static_cast<size_t>(nb));
    std::iota(table.begin(), table.end(), 0);

    StepBatch pre;
    pre.seqs.push_back(SeqStep{0, g.ids, table, true});
    SelectionTrace tr;
    StepOutput out = b.step(pre, &tr);
    add(check_logits(p + " prefill logits", out.logits.data(), g.prefill_logits.data(), g.tokens(), V, opt.logits_rel_tol));
    add(check_blocks(p + " prefill selections", g, tr));
    if (g.steps() == 0) continue;

    std::vector<float> steps(size_t(g.steps()) * V);
    std::copy_n(out.row(0, g.tokens() - 1), V, steps.begin());
    for (int s = 1; s < g.steps(); ++s) {
      StepBatch dec;
      dec.seqs.push_back(SeqStep{g.tokens() + s - 1, {g.greedy_ids[size_t(s - 1)]}, table, false});
      StepOutput o = b.step(dec);
      std::copy_n(o.row(0), V, steps.begin() + ptrdiff_t(size_t(s) * V));
    }
    add(check_logits(p + " step logits", steps.data(), g.step_logits.data(), g.steps(), V, opt.logits_rel_tol));

    ConformanceCheck gc{p + " greedy ids", true, 0, ""};
    for (int s = 0; s < g.steps(); ++s) {
      const float* row = steps.data() + size_t(s) * V;
      int am = argmax_token(row, V), want = g.greedy_ids[size_t(s)];
      if (am == want) continue;
      if (gc.ok) {
        const float* gr = g.step_logits.data() + size_t(s) * V;
        gc.detail = fmt::format("first at step {}: engine argmax {} (logit {:.7g}, golden logit {:.7g}), golden id {} "
                                "(engine logit {:.7g}, golden logit {:.7g})",
                                s, am, row[am], gr[am], want, row[want], gr[want]);
      }
      gc.ok = false;
      gc.worst += 1;
    }
    if (gc.ok) gc.detail = fmt::format("{} of {} equal", g.steps(), g.steps());
    else gc.detail = fmt::format("{} of {} differ; ", int(gc.worst), g.steps()) + gc.detail;
    add(std::move(gc));
  }
  return rep;
}

}  // namespace m3::ref
