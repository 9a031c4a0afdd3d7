// The router rounding probe (m3mono router-probe, docs/router-probe.md): on fixed router inputs
// (the post-attention-norm rows entering one MoE layer, captured once from the FP32 run:
// ref/router_capture.h), router A with one weight against router B with another, typically the
// checkpoint's FP32 weight against the same weight rounded to BF16. Both routers compute their
// logits with ref::linear (exact products, double sums, logits rounded to fp32), add the fp32
// correction bias to the fp32 sigmoid and choose with ref::route_token, so the weight is the only
// difference between them.
#pragma once
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "model/weights.h"

namespace m3::ref {

// w with every element rounded to BF16 (nearest even, core/codecs.h) and widened back to fp32.
Mat round_to_bf16(const Mat& w);
// How many elements of w BF16 rounding changes (0: the weight is already BF16-exact).
int64_t count_bf16_inexact(const Mat& w);

// One row through both routers.
struct RouterRowDiff {
  std::vector<int> experts_a, experts_b;    // top-k ids, best first
  std::vector<float> weights_a, weights_b;  // renormalized combine weights (sum 1; before routed_scale)
  // Router A's top-k margin: its k-th best choice score (sigmoid + bias) minus the best one left
  // out, in double; +inf when top_k equals the number of experts.
  double margin_a = 0;
  double max_logit_diff = 0;   // max over experts |logit_a - logit_b|
  double max_weight_diff = 0;  // max over experts |w_a - w_b|, an expert not chosen weighing 0
  bool set_changed = false;    // the chosen sets differ (their order is not compared)
};

struct RouterComparison {
  int rows = 0;
  int sets_changed = 0;     // rows whose top-k set differs
  int weights_changed = 0;  // rows whose max_weight_diff exceeds the threshold
  double max_logit_diff = 0, max_weight_diff = 0;
  double min_margin;        // smallest margin_a over the rows (+inf when none is finite)
  int min_margin_row = -1;
  std::vector<RouterRowDiff> per_row;
};

// Both routers over x [n_rows, hidden]: wa, wb [E, hidden], bias [E], top_k <= E. weight_tol: the
// threshold on max_weight_diff (> 0).
RouterComparison compare_routers(const Mat& wa, const Mat& wb, const Vec& bias, int top_k, const float* x, int n_rows,
                                 double weight_tol, ThreadPool& pool);

// One MoE layer's router, FP32 weight (A) against its BF16 rounding (B).
struct RouterLayerProbe {
  int layer = -1;
  int64_t weight_elements = 0;  // E * hidden
  int64_t bf16_inexact = 0;     // elements the rounding changes
  RouterComparison cmp;
};
RouterLayerProbe probe_router_rounding(const LayerWeights& lw, int layer, int top_k, const float* x, int n_rows,
                                       double weight_tol, ThreadPool& pool);

}  // namespace m3::ref
