// Per-step path choice. Each step's batch is offered to the registered paths in preference order
// (e.g. "mono" first when it exists); the first that accepts runs it, and the refusal reason of
// the preferred path that declined is recorded as the step's fallback reason. The "native" path
// (the backend the engine was built with) accepts every batch and always comes last.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace m3 {

// Returns "" when the path can run the batch, else a short refusal reason (a metrics label).
using Eligibility = std::function<std::string(const StepBatch&)>;

struct PathChoice {
  int path = 0;                 // index into Dispatcher::paths()
  std::string name;             // "native", "mono", ...
  std::string fallback_reason;  // why a preferred path declined this step ("" when none did)
};

class Dispatcher {
 public:
  explicit Dispatcher(std::unique_ptr<Backend> native);

  // Adds a path tried before the ones already added (except native, which stays last). The
  // path's backend must share the native backend's cache (same block size and count).
  void add_preferred_path(std::string name, Backend* backend, Eligibility eligible);

  PathChoice choose(const StepBatch& batch) const;
  StepOutput run(const PathChoice& choice, const StepBatch& batch, SelectionTrace* trace = nullptr);

  Backend& native() { return *native_; }
  const Backend& native() const { return *native_; }
  std::vector<std::string> path_names() const;

 private:
  struct Path {
    std::string name;
    Backend* backend;
    Eligibility eligible;  // empty for native
  };
  std::unique_ptr<Backend> native_;
  std::vector<Path> paths_;  // preference order; native last
};

// The per-batch rules of the mono contract (shared/docs/design.md, "Eligibility"): decode-only
// batches (every sequence appends exactly one token) of at most `max_rows` sequences. Returns ""
// or the refusal reason ("prefill", "batch_too_large").
std::string mono_batch_refusal(const StepBatch& batch, int max_rows = 4);

}  // namespace m3
