// speculative_args.h.
#include "cli/speculative_args.h"

#include <CLI/CLI.hpp>

#include "core/check.h"

namespace m3::cli {

void add_speculative_options(CLI::App& app, SpeculativeArgs& a) {
  app.add_option("--speculative", a.method,
                 "speculative decoding: none, or ngram (drafts: the continuation of the latest earlier occurrence "
                 "of the last n tokens; greedy output is exactly that of plain decoding)")
      ->capture_default_str();
  app.add_option("--num-draft-tokens", a.num_draft_tokens, "drafts per verify step (1..3)")->capture_default_str();
  app.add_option("--ngram-min", a.ngram_min, "shortest n-gram matched")->capture_default_str();
  app.add_option("--ngram-max", a.ngram_max, "longest n-gram matched (tried first)")->capture_default_str();
}

SpeculativeOptions speculative_options(const SpeculativeArgs& a, const std::string& what) {
  SpeculativeOptions o;
  try {
    o.method = parse_speculative_method(a.method);
    o.num_draft_tokens = a.num_draft_tokens;
    o.ngram_min = a.ngram_min;
    o.ngram_max = a.ngram_max;
    validate_speculative(o);
  } catch (const Error& e) {
    M3_FAIL("{}: --speculative / --num-draft-tokens / --ngram-min / --ngram-max: {}", what, e.what());
  }
  return o;
}

}  // namespace m3::cli
