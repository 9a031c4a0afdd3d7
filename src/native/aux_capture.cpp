// Auxiliary hidden states on the native path (native/aux_capture.h).
#include "native/aux_capture.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.h"
#include "native/gather_rows.h"
#include "native/cuda_check.h"

namespace m3::native {

int aux_capture_op(const LayerPlan& plan, int l) {
  const int L = int(plan.layer_begin.size()) - 1;
  M3_CHECK(l >= 0 && l <= L, "aux capture: layer {} outside [0, {}]", l, L);
  const int b = plan.layer_first_op(l);
  // the layer's first op is its input norm (or, l = L, the final norm) when it adds the residual
  // itself; otherwise the op before the layer completed it (the embedding, or a fused MoE combine)
  if (b < int(plan.ops.size()) && plan.ops[size_t(b)].kind == OpKind::RmsNorm) return b;
  M3_CHECK(b >= 1, "aux capture: layer {} begins the plan", l);
  return b - 1;
}

namespace {
// An input norm op that adds the residual (layer l's first op when the plan does not fuse it):
// what a runner's part starting at layer l copies out before it runs (AuxCapture::before_runner).
bool adds_residual(const OpCall& op) {
  return op.kind == OpKind::RmsNorm && std::get<kernels::RmsNormParams>(op.params).residual != nullptr;
}
}  // namespace

bool aux_runner_cuts(const LayerPlan& plan, std::span<const int> layers, LayerRange range, std::vector<int>* cuts) {
  cuts->clear();
  if (range.empty()) return true;
  const int lo = plan.layer_first_op(range.first), hi = plan.layer_first_op(range.last);
  for (int l : layers) {
    const int i = aux_capture_op(plan, l);
    if (i < lo || i >= hi) continue;
    int m = range.first;  // the layer holding op i
    while (plan.layer_first_op(m + 1) <= i) ++m;
    if (i == plan.layer_first_op(m + 1) - 1) {  // the layer's last op (a fused MoE combine): a part ends there
      cuts->push_back(m + 1);
      continue;
    }
    // the layer's own input norm: a part starts at the layer, x + residual copied before it runs
    if (i != plan.layer_first_op(m) || !adds_residual(plan.ops[size_t(i)])) return false;
    if (m > range.first) cuts->push_back(m);
  }
  std::sort(cuts->begin(), cuts->end());
  cuts->erase(std::unique(cuts->begin(), cuts->end()), cuts->end());
  return true;
}

AuxCapture::AuxCapture(const LayerPlan& plan, std::span<const int> layers, const float* x, int hidden, int rows,
                       float* dst, PlanObserver* inner)
    : plan_(&plan), x_(x), hidden_(hidden), rows_(rows), width_(int(layers.size()) * hidden), dst_(dst), inner_(inner) {
  for (size_t k = 0; k < layers.size(); ++k)
    points_.push_back(Point{&plan.ops[size_t(aux_capture_op(plan, layers[k]))], int(k)});
}

void AuxCapture::before(const OpCall& op, cudaStream_t stream) {
  if (inner_) inner_->before(op, stream);
}

void AuxCapture::copy(const Point& p, cudaStream_t stream) const {
  M3_CUDA_CHECK(cudaMemcpy2DAsync(dst_ + size_t(p.column) * hidden_, size_t(width_) * 4, x_, size_t(hidden_) * 4,
                                  size_t(hidden_) * 4, size_t(rows_), cudaMemcpyDeviceToDevice, stream));
}

void AuxCapture::after(const OpCall& op, cudaStream_t stream) {
  if (inner_) inner_->after(op, stream);
  for (const Point& p : points_)
    if (p.op == &op) copy(p, stream);
}

void AuxCapture::before_runner(const LayerRangeRunner& runner, LayerRange range, cudaStream_t stream) {
  if (inner_) inner_->before_runner(runner, range, stream);
  if (plan_->layer_first_op(range.first) >= int(plan_->ops.size())) return;
  const OpCall* first = &plan_->ops[size_t(plan_->layer_first_op(range.first))];
  if (!adds_residual(*first)) return;
  const auto& np = std::get<kernels::RmsNormParams>(first->params);
  for (const Point& p : points_)
    if (p.op == first) {  // x + residual: the norm's first step (r = x + residual, one fp32 add)
      kernels::GatherRowsParams g =
          make_gather_rows_params(np.x, np.ld_x, nullptr, rows_, hidden_, dst_ + size_t(p.column) * hidden_, width_);
      g.add = np.residual;
      g.ld_add = np.ld_res;
      launch(g, stream);
    }
}

void AuxCapture::after_runner_part(const LayerPlan& plan, int end, cudaStream_t stream) {
  if (inner_) inner_->after_runner_part(plan, end, stream);
  const OpCall* last = &plan.ops[size_t(plan.layer_first_op(end) - 1)];
  for (const Point& p : points_)
    if (p.op == last) copy(p, stream);
}

}  // namespace m3::native
