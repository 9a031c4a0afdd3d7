// The end-to-end half of the router rounding probe (m3mono router-probe --end-to-end): greedy
// decoding with the checkpoint's FP32 router (run A) and with every router weight rounded to BF16
// (run B), all else equal, compared step by step. Up to and including the first step whose
// tokens differ both runs saw the same tokens, so their logits and expert choices are comparable
// there; after it they are not.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "model/spec.h"
#include "model/weights.h"
#include "ref/greedy_run.h"

namespace m3::ref {

struct EndToEndComparison {
  int steps = 0;
  std::vector<int32_t> tokens_a, tokens_b;
  int first_divergence = -1;  // first step whose tokens differ (-1: none)
  double margin_a = std::numeric_limits<double>::quiet_NaN();  // top-1 minus top-2 logit there, run A
  double margin_b = std::numeric_limits<double>::quiet_NaN();  // the same, run B
  int compared_steps = 0;     // steps with identical inputs: through first_divergence, else all
  double max_logit_diff = 0;  // max |logit_a - logit_b| over the compared steps
  double min_margin_a = std::numeric_limits<double>::infinity();  // smallest run-A margin over them
  int64_t expert_sets = 0, expert_sets_changed = 0;  // (token, layer) sets of `layers` over them
  int first_set_change_step = -1, first_set_change_layer = -1;
};

// Compares two runs of the same prompt (both with logits and traces kept), counting expert sets
// on the given MoE layers.
EndToEndComparison compare_greedy_runs(const GreedyRun& a, const GreedyRun& b, const std::vector<int>& layers);

// Every MoE layer's router weight rounded to BF16 in place (the correction bias is left fp32).
void round_routers_to_bf16(const ModelSpec& spec, ModelWeights& w);

struct EndToEndOptions {
  int threads = 0;  // CPU reference threads (0: all cores)
  std::function<void(char run, int step, int steps)> progress;  // run 'A' or 'B', after each step
};

// Loads the weights (load() is called once per run, so only one copy is held at a time), runs A
// and B for `steps` greedy steps and compares them on `layers`.
EndToEndComparison router_end_to_end(const ModelSpec& spec, const std::function<ModelWeights()>& load,
                                     const std::vector<int32_t>& prompt, int steps, const std::vector<int>& layers,
                                     const EndToEndOptions& opt = {});

}  // namespace m3::ref
