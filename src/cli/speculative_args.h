// The speculative-decoding flags of generate and serve (runtime/speculative.h).
#pragma once
#include <string>

#include "model/spec.h"
#include "runtime/speculative.h"

namespace CLI {
class App;
}

namespace m3::cli {

struct SpeculativeArgs {
  std::string method = "none";
  int num_draft_tokens = 3;
  int ngram_min = 1, ngram_max = 4;
  std::string draft_model;  // eagle3: the draft checkpoint directory
  int draft_threads = 0;
  std::string draft_device = "auto";  // eagle3: cpu, cuda or auto (the target's device)
};

void add_speculative_options(CLI::App& app, SpeculativeArgs& a);
// The options, checked; errors start with `what` (e.g. "generate") and name the flag. eagle3 loads
// the draft (--draft-model) beside the target checkpoint `model_dir` of spec `target`, on the GPU
// when --draft-device says cuda, or auto and `target_on_gpu`.
SpeculativeOptions speculative_options(const SpeculativeArgs& a, const std::string& what, const std::string& model_dir,
                                       const ModelSpec& target, bool target_on_gpu);

}  // namespace m3::cli
