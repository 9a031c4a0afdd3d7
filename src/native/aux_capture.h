// The target's auxiliary hidden states on the native path (StepBatch::aux_layers, EAGLE3 drafts):
// while a plan runs, after the op that completes the residual stream entering layer l (the
// embedding for l = 0; the input norm that adds the last layer's output, or the op before layer l
// when the previous layer's MoE combine added it; the final norm for l = num_layers), act.x's rows
// are copied into column block k of a [rows][aux_layers.size() x hidden] device buffer. The copies
// are stream operations, so a captured graph replays them. A LayerRangeRunner (mono) then runs its
// range in parts cut where a copy must be made (aux_runner_cuts, Forward::run).
#pragma once
#include <span>
#include <vector>

#include "native/forward.h"

namespace m3::native {

// The index of the op after which act.x holds the hidden state entering layer l (0 <= l <= L).
int aux_capture_op(const LayerPlan& plan, int l);
// Where a runner of `range` (its layers' ops skipped) must be cut so that every listed layer's
// capture op runs outside it, ends one of its parts (the last op of a layer inside the range: the
// MoE combine that adds the layer's output) or begins one (a layer's own input norm that adds the
// residual: x + residual is copied before the part runs, the gather op's add); Forward::run's cuts,
// sorted. False when a capture op sits elsewhere inside a layer of the range.
bool aux_runner_cuts(const LayerPlan& plan, std::span<const int> layers, LayerRange range, std::vector<int>* cuts);

class AuxCapture final : public PlanObserver {
 public:
  // x: act.x ([rows][hidden]); dst: [rows][layers.size() * hidden]; inner (may be null) sees every
  // call first.
  AuxCapture(const LayerPlan& plan, std::span<const int> layers, const float* x, int hidden, int rows, float* dst,
             PlanObserver* inner);
  void before(const OpCall& op, cudaStream_t stream) override;
  void after(const OpCall& op, cudaStream_t stream) override;
  // The copies of a part's first layer whose own input norm adds the residual (x + residual).
  void before_runner(const LayerRangeRunner& runner, LayerRange range, cudaStream_t stream) override;
  // The copies of layer end - 1's last op (which the runner ran).
  void after_runner_part(const LayerPlan& plan, int end, cudaStream_t stream) override;

 private:
  struct Point {
    const OpCall* op;
    int column;  // index in the layer list
  };
  void copy(const Point& p, cudaStream_t stream) const;
  std::vector<Point> points_;
  const LayerPlan* plan_;
  const float* x_;
  int hidden_, rows_, width_;
  float* dst_;
  PlanObserver* inner_;
};

}  // namespace m3::native
