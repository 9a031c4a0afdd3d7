// Greedy decoding of one sequence through any Backend, for probes that compare two runs
// (ref/router_capture.h, ref/router_end_to_end.h): step 0 prefills the prompt, step i > 0 feeds
// the token chosen at step i - 1; each step's token is the argmax of its logits (lowest id on a
// tie, as sample_token at temperature 0).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace m3::ref {

struct GreedyRun {
  std::vector<int32_t> tokens;              // [steps]: the token chosen at each step
  std::vector<std::vector<float>> logits;   // [steps][vocab] (kept only when asked)
  std::vector<double> margins;              // [steps]: top-1 minus top-2 logit (0 on a tie)
  std::vector<SelectionTrace> traces;       // [steps] (kept only when asked)
};

struct GreedyOptions {
  bool keep_logits = false;
  bool keep_traces = false;
  std::function<void(int step, int steps)> progress;  // after each step
};

// Cache positions a run of `steps` steps needs: prompt + steps - 1 (the last token is not fed).
int64_t greedy_positions(size_t prompt_len, int steps);

// Runs `steps` >= 1 steps on b (blocks 0, 1, ... of its cache as the block table).
GreedyRun greedy_run(Backend& b, const std::vector<int32_t>& prompt, int steps, const GreedyOptions& opt = {});

// Top-1 minus top-2 of a logits row (vocab >= 2; 0 when the two largest are equal).
double top2_margin(const float* logits, int vocab);

}  // namespace m3::ref
