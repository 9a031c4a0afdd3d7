// Conformance of any Backend against a golden file (ref/golden.h): for each prompt
//   - prefill logits, every row: max|d| <= tol * max|ref| of that row (tol 1e-3 by default);
//   - the indexer's selections during prefill, compared as sets per (layer, group, token);
//   - per-step logits along the golden greedy path (fed through the cache one token at a time,
//     always the golden token so later rows stay comparable), same bound;
//   - greedy ids: the engine's argmax at every step equals the golden id.
// Each check reports its worst element (row, column, values) so a failure says where to look.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ref/golden.h"
#include "runtime/backend.h"

namespace m3::ref {

struct ConformanceOptions {
  double logits_rel_tol = 1e-3;  // per row, relative to the row's max |ref|
};

struct ConformanceCheck {
  std::string name;    // "p1 prefill logits"
  bool ok = true;
  double worst = 0;    // logits: worst max|d| / max|ref| over rows; others: number of bad rows
  std::string detail;  // where the worst error is
};

struct ConformanceReport {
  std::vector<ConformanceCheck> checks;
  bool ok() const;
};

// Runs every prompt through `b` (sequence positions from 0, physical blocks 0, 1, ...; each prompt
// overwrites the previous one's cache). `on_check` is called as each check completes.
ConformanceReport run_conformance(Backend& b, const std::vector<GoldenPrompt>& golden,
                                  const ConformanceOptions& opt = {},
                                  const std::function<void(const ConformanceCheck&)>& on_check = {});

}  // namespace m3::ref
