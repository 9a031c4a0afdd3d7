// The speculative-decoding flags of generate and serve (runtime/speculative.h).
#pragma once
#include <string>

#include "runtime/speculative.h"

namespace CLI {
class App;
}

namespace m3::cli {

struct SpeculativeArgs {
  std::string method = "none";
  int num_draft_tokens = 3;
  int ngram_min = 1, ngram_max = 4;
};

void add_speculative_options(CLI::App& app, SpeculativeArgs& a);
// The options, checked; errors start with `what` (e.g. "generate") and name the flag.
SpeculativeOptions speculative_options(const SpeculativeArgs& a, const std::string& what);

}  // namespace m3::cli
