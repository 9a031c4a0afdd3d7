// The seam between the native forward and another executor of the sparse layers (the mono path,
// src/mono/, implements it). The backend runs embedding, dense layers, final norm and lm_head
// through its plan; per step it may hand the sparse range (ForwardModel::sparse_range) to a
// LayerRangeRunner that accepted the step instead of launching the plan's ops for those layers.
// The runner reads the same prepared weights and caches the plan reads (never a copy) and must
// leave the residual stream exactly as the plan's ops would: Activations::x (residual) and
// Activations::f (the last sublayer's output, added by the next norm) over the plan's rows.
#pragma once
#include <string>

#include "native/layer_plan.h"
#include "runtime/backend.h"

namespace m3::native {

class LayerRangeRunner {
 public:
  virtual ~LayerRangeRunner() = default;
  virtual std::string name() const = 0;  // the path's name ("mono")
  // "" when it runs this step's sparse range, else why not (a metrics label, e.g. "prefill").
  virtual std::string refusal(const StepBatch& batch) = 0;
  // Enqueues layers [range.first, range.last) of `plan` (a plan of the step it accepted) on stream,
  // in place of the plan's ops for them. Capturable: graph replays of the step repeat it.
  virtual void run_layers(const LayerPlan& plan, LayerRange range, cudaStream_t stream) = 0;
  // After the step's stream synchronized: "" when the runner's launches of the step completed,
  // else what went wrong (the backend then re-runs the step natively and counts "<name>:fault").
  virtual std::string take_error() { return ""; }
};

}  // namespace m3::native
