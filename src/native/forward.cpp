// Forward (native/forward.h).
#include "native/forward.h"

#include "core/check.h"

#include "native/cuda_check.h"

namespace m3::native {

Forward::Forward(std::shared_ptr<const PreparedWeights> weights, DeviceKvCache& cache, const ForwardOptions& opt)
    : opt_(opt),
      model_(std::move(weights), cache, opt.max_model_len, opt.comm),
      act_(model_, opt.max_tokens, opt.logits_rows),
      meta_(opt.max_tokens, opt.max_seqs > 0 ? opt.max_seqs : opt.max_tokens,
            (opt.max_model_len + model_.spec().index_block - 1) / model_.spec().index_block),
      table_width_((opt.max_model_len + model_.spec().index_block - 1) / model_.spec().index_block) {}

void Forward::upload(const StepMetadata& m, std::span<const int32_t> ids, cudaStream_t stream) {
  M3_CHECK(int(ids.size()) == m.num_tokens, "forward: {} token ids for {} rows", ids.size(), m.num_tokens);
  meta_.upload(m, stream);
  M3_CUDA_CHECK(cudaMemcpyAsync(act_.ids.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream));
}

StepMetadataView Forward::bucket_view(int rows) const {
  StepMetadataView v = meta_.view();
  v.num_tokens = rows;
  v.table_width = table_width_;
  v.max_context = opt_.max_model_len;
  return v;
}

const LayerPlan& Forward::bucket_plan(int rows) {
  if (size_t(rows) >= bucket_plans_.size()) bucket_plans_.resize(size_t(rows) + 1);
  auto& p = bucket_plans_[size_t(rows)];
  if (!p) p = std::make_unique<LayerPlan>(build_layer_plan(model_, act_, PlanShape{rows, bucket_view(rows), true}));
  return *p;
}

void Forward::run_ops(const LayerPlan& plan, int begin, int end, cudaStream_t stream, PlanObserver* obs) {
  for (int i = begin; i < end; ++i) {
    const OpCall& op = plan.ops[size_t(i)];
    if (obs) obs->before(op, stream);
    launch(op, stream, opt_.launch);
    if (obs) obs->after(op, stream);
  }
}

void Forward::run(const LayerPlan& plan, cudaStream_t stream, PlanObserver* obs, LayerRangeRunner* runner,
                  std::span<const int> cuts) {
  const int n = int(plan.ops.size());
  const LayerRange r = model_.sparse_range();
  if (!runner || r.empty()) return run_ops(plan, 0, n, stream, obs);
  run_ops(plan, 0, plan.layer_first_op(r.first), stream, obs);
  int a = r.first;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const int b = k < cuts.size() ? cuts[k] : r.last;
    M3_CHECK(b > a && b <= r.last, "forward: runner cut at layer {} outside ({}, {}] or out of order", b, a, r.last);
    const LayerRange part{a, b};
    if (obs) obs->before_runner(*runner, part, stream);
    runner->run_layers(plan, part, stream);
    if (obs && k < cuts.size()) obs->after_runner_part(plan, b, stream);
    a = b;
    if (b == r.last) break;
  }
  M3_CHECK(a == r.last, "forward: runner parts end at layer {}, the range at {}", a, r.last);
  run_ops(plan, plan.layer_first_op(r.last), n, stream, obs);
}

}  // namespace m3::native
