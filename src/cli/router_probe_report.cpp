#include "cli/router_probe_report.h"

#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace m3::cli {

namespace {
using json = nlohmann::ordered_json;

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.3g}", v) : std::string("none"); }
json num_json(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
void line(const std::string& s) { std::printf("%s\n", s.c_str()); }

struct Totals {
  int rows = 0, sets = 0, weights = 0;
  int64_t elements = 0, inexact = 0;
  double logit = 0, weight = 0, margin = INFINITY;
};
Totals totals(const ProbeReport& r) {
  Totals t;
  for (const auto& p : r.layers) {
    t.rows += p.cmp.rows;
    t.sets += p.cmp.sets_changed;
    t.weights += p.cmp.weights_changed;
    t.elements += p.weight_elements;
    t.inexact += p.bf16_inexact;
    t.logit = std::max(t.logit, p.cmp.max_logit_diff);
    t.weight = std::max(t.weight, p.cmp.max_weight_diff);
    t.margin = std::min(t.margin, p.cmp.min_margin);
  }
  return t;
}
bool listed(const ref::RouterRowDiff& d, double tol) { return d.set_changed || d.max_weight_diff > tol; }
}  // namespace

void print_probe_text(const ProbeReport& r) {
  const int rows = r.layers.empty() ? 0 : r.layers[0].cmp.rows;
  line(fmt::format("router probe of {}: {} rows per layer ({} prompt + {} greedy tokens of the FP32 run), top-{} of {} "
                   "experts", r.model, rows, r.prompt_tokens, r.decode_tokens, r.top_k, r.num_experts));
  line("router A: the checkpoint's FP32 weight; router B: that weight rounded to BF16; both: fp32 logits, sigmoid and "
       "correction bias, the same top-k code, the same captured rows");
  line(fmt::format("  {:>5} {:>6} {:>22} {:>12} {:>14} {:>12} {:>12} {:>16}", "layer", "rows", "not BF16-exact",
                   "sets changed", fmt::format("weights > {:g}", r.weight_tol), "max|dlogit|", "max|dweight|",
                   "min top-k margin"));
  auto row = [&](const std::string& name, int n, int64_t inexact, int64_t elements, int sets, int weights, double dl,
                 double dw, double margin) {
    line(fmt::format("  {:>5} {:>6} {:>22} {:>12} {:>14} {:>12} {:>12} {:>16}", name, n,
                     fmt::format("{} / {}", inexact, elements), sets, weights, num(dl), num(dw), num(margin)));
  };
  for (const auto& p : r.layers)
    row(std::to_string(p.layer), p.cmp.rows, p.bf16_inexact, p.weight_elements, p.cmp.sets_changed,
        p.cmp.weights_changed, p.cmp.max_logit_diff, p.cmp.max_weight_diff, p.cmp.min_margin);
  const Totals t = totals(r);
  if (r.layers.size() > 1) row("all", t.rows, t.inexact, t.elements, t.sets, t.weights, t.logit, t.weight, t.margin);

  const int kMaxListed = 20;
  int shown = 0, more = 0;
  for (const auto& p : r.layers)
    for (size_t i = 0; i < p.cmp.per_row.size(); ++i) {
      const auto& d = p.cmp.per_row[i];
      if (!listed(d, r.weight_tol)) continue;
      if (shown == 0) line("rows that changed (row r = position r):");
      if (shown++ >= kMaxListed) {
        ++more;
        continue;
      }
      line(fmt::format("  layer {} row {} (token {}): experts A [{}] B [{}]{}, top-k margin {}, max|dweight| {}, "
                       "max|dlogit| {}", p.layer, i, r.tokens[i], fmt::join(d.experts_a, " "), fmt::join(d.experts_b, " "),
                       d.set_changed ? " (set changed)" : "", num(d.margin_a), num(d.max_weight_diff),
                       num(d.max_logit_diff)));
    }
  if (more > 0) line(fmt::format("  ... and {} more (--json lists every one)", more));
  if (t.inexact == 0)
    line("note: every router weight element of these layers is already BF16-exact, so rounding changes nothing");
  line(fmt::format("summary: BF16 router weights changed {} of {} top-{} sets ({:.2f}%) and moved {} rows' weights by "
                   "more than {:g}; largest logit change {}; smallest FP32 top-k margin {}",
                   t.sets, t.rows, r.top_k, t.rows ? 100.0 * t.sets / t.rows : 0.0, t.weights, r.weight_tol,
                   num(t.logit), num(t.margin)));
}

json probe_json(const ProbeReport& r) {
  json j;
  j["schema"] = "m3mono-router-probe/1";
  j["mode"] = "fixed-activations";
  j["model"] = r.model;
  j["prompt_tokens"] = r.prompt_tokens;
  j["decode_tokens"] = r.decode_tokens;
  j["tokens"] = r.tokens;
  j["num_experts"] = r.num_experts;
  j["top_k"] = r.top_k;
  j["weight_tol"] = r.weight_tol;
  json layers = json::array();
  for (const auto& p : r.layers) {
    json l;
    l["layer"] = p.layer;
    l["rows"] = p.cmp.rows;
    l["weight_elements"] = p.weight_elements;
    l["bf16_inexact_elements"] = p.bf16_inexact;
    l["sets_changed"] = p.cmp.sets_changed;
    l["weights_changed"] = p.cmp.weights_changed;
    l["max_logit_diff"] = p.cmp.max_logit_diff;
    l["max_weight_diff"] = p.cmp.max_weight_diff;
    l["min_topk_margin"] = num_json(p.cmp.min_margin);
    l["min_topk_margin_row"] = p.cmp.min_margin_row;
    json changed = json::array();
    for (size_t i = 0; i < p.cmp.per_row.size(); ++i) {
      const auto& d = p.cmp.per_row[i];
      if (!listed(d, r.weight_tol)) continue;
      changed.push_back({{"row", i}, {"token", r.tokens[i]}, {"set_changed", d.set_changed},
                         {"experts_fp32", d.experts_a}, {"experts_bf16", d.experts_b},
                         {"weights_fp32", d.weights_a}, {"weights_bf16", d.weights_b},
                         {"topk_margin", num_json(d.margin_a)}, {"max_weight_diff", d.max_weight_diff},
                         {"max_logit_diff", d.max_logit_diff}});
    }
    l["changed_rows"] = std::move(changed);
    layers.push_back(std::move(l));
  }
  j["layers"] = std::move(layers);
  const Totals t = totals(r);
  j["total"] = {{"rows", t.rows}, {"weight_elements", t.elements}, {"bf16_inexact_elements", t.inexact},
                {"sets_changed", t.sets}, {"weights_changed", t.weights}, {"max_logit_diff", t.logit},
                {"max_weight_diff", t.weight}, {"min_topk_margin", num_json(t.margin)}};
  return j;
}

void print_end_to_end_text(const EndToEndReport& r) {
  const auto& c = r.cmp;
  line(fmt::format("router end-to-end probe of {}: {} prompt tokens, {} greedy steps per run", r.model, r.prompt_tokens,
                   c.steps));
  line("run A: the checkpoint's FP32 router weights; run B: every router weight rounded to BF16 (logits, sigmoid, "
       "bias and everything else as in A)");
  line(fmt::format("  tokens A: {}", fmt::join(c.tokens_a, ",")));
  line(fmt::format("  tokens B: {}", fmt::join(c.tokens_b, ",")));
  if (c.first_divergence >= 0)
    line(fmt::format("first divergence: step {} (A chose {}, B chose {}); top-2 logits margin there: A {}, B {}",
                     c.first_divergence, c.tokens_a[size_t(c.first_divergence)],
                     c.tokens_b[size_t(c.first_divergence)], num(c.margin_a), num(c.margin_b)));
  else
    line(fmt::format("no divergence in {} steps", c.steps));
  line(fmt::format("over steps 0-{} (identical inputs): max|dlogit| {}, smallest top-2 logits margin of A {}; expert "
                   "sets changed {} of {} (layers {}){}",
                   c.compared_steps - 1, num(c.max_logit_diff), num(c.min_margin_a), c.expert_sets_changed,
                   c.expert_sets, fmt::join(r.layers, ","),
                   c.first_set_change_step >= 0
                       ? fmt::format(", first at step {} layer {}", c.first_set_change_step, c.first_set_change_layer)
                       : std::string()));
}

json end_to_end_json(const EndToEndReport& r) {
  const auto& c = r.cmp;
  json j;
  j["schema"] = "m3mono-router-probe/1";
  j["mode"] = "end-to-end";
  j["model"] = r.model;
  j["prompt_tokens"] = r.prompt_tokens;
  j["steps"] = c.steps;
  j["layers"] = r.layers;
  j["tokens_fp32"] = c.tokens_a;
  j["tokens_bf16"] = c.tokens_b;
  j["diverged"] = c.first_divergence >= 0;
  if (c.first_divergence >= 0)
    j["first_divergence"] = {{"step", c.first_divergence},
                             {"token_fp32", c.tokens_a[size_t(c.first_divergence)]},
                             {"token_bf16", c.tokens_b[size_t(c.first_divergence)]},
                             {"logits_margin_fp32", num_json(c.margin_a)},
                             {"logits_margin_bf16", num_json(c.margin_b)}};
  else
    j["first_divergence"] = nullptr;
  j["compared_steps"] = c.compared_steps;
  j["max_logit_diff"] = c.max_logit_diff;
  j["min_logits_margin_fp32"] = num_json(c.min_margin_a);
  j["expert_sets"] = c.expert_sets;
  j["expert_sets_changed"] = c.expert_sets_changed;
  j["first_set_change"] = c.first_set_change_step >= 0
                              ? json{{"step", c.first_set_change_step}, {"layer", c.first_set_change_layer}}
                              : json(nullptr);
  return j;
}

}  // namespace m3::cli
