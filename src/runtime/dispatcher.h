// Per-step path choice inside a backend. Each step's batch is offered to the registered paths in
// preference order (e.g. "mono" first); the first that accepts runs it, and the refusal reason of
// the first preferred path that declined is recorded as the step's fallback reason. "native"
// accepts every batch and always comes last. The choice is made step by step: a batch one path
// refuses never stops it from taking a later one. The dispatcher counts steps per path and
// fallbacks per reason (generate prints them; the engine's /metrics counts StepOutput::path).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace m3 {

// Returns "" when the path can run the batch, else a short refusal reason (a metrics label).
using Eligibility = std::function<std::string(const StepBatch&)>;

struct PathChoice {
  int path = 0;                 // index into path_names()
  std::string name;             // "native", "mono", ...
  std::string fallback_reason;  // "<path>:<reason>" of the first preferred path that declined ("" when none did)
};

class Dispatcher {
 public:
  Dispatcher();  // "native" only

  // Adds a path tried before the ones already added (native stays last).
  void add_preferred_path(std::string name, Eligibility eligible);

  // Chooses and counts.
  PathChoice choose(const StepBatch& batch);

  // A step counted for `path` that the path failed and native re-ran: counted for native instead,
  // with the fallback reason "<path>:<reason>".
  void count_failure(const std::string& path, const std::string& reason);

  std::vector<std::string> path_names() const;
  const std::map<std::string, uint64_t>& steps_by_path() const { return steps_; }
  const std::map<std::string, uint64_t>& fallbacks() const { return fallbacks_; }  // reason -> steps

 private:
  struct Path {
    std::string name;
    Eligibility eligible;  // empty for native
  };
  std::vector<Path> paths_;  // preference order; native last
  std::map<std::string, uint64_t> steps_, fallbacks_;
};

// The per-batch rules of the mono contract (shared/docs/design.md, "Eligibility"): decode-only
// batches (every sequence appends exactly one token) of at most `max_rows` sequences. Returns ""
// or the refusal reason ("prefill", "batch_too_large").
std::string mono_batch_refusal(const StepBatch& batch, int max_rows = 4);

}  // namespace m3
