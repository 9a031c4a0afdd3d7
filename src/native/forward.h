// The native forward of one pass: a ForwardModel (weights, caches, numerics constants), its
// Activations, fixed-address step metadata, and plans (native/layer_plan.h) executed op by op
// through the launch helper. CudaBackend (native/cuda_backend.h) drives it for serving; the
// benchmark drives it directly (bench/cuda/native_runner.cpp), walking the same plans with an
// observer for its per-op spans.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "native/activations.h"
#include "native/forward_model.h"
#include "native/layer_plan.h"
#include "native/layer_range.h"
#include "native/step_metadata.h"

namespace m3::native {

// Sees every op of a plan while its launch is enqueued on the stream (a benchmark may enqueue
// timing events there, also inside a capture; a trace recorder copies outputs after an op).
class PlanObserver {
 public:
  virtual ~PlanObserver() = default;
  virtual void before(const OpCall& op, cudaStream_t stream) { (void)op, (void)stream; }
  virtual void after(const OpCall& op, cudaStream_t stream) { (void)op, (void)stream; }
  // Before a LayerRangeRunner enqueues the layers it runs in place of the plan's ops.
  virtual void before_runner(const LayerRangeRunner& runner, LayerRange range, cudaStream_t stream) {
    (void)runner, (void)range, (void)stream;
  }
  // After a runner's part of its range that ends at layer `end` (Forward::run's cuts): what layer
  // end - 1's ops left is in the activations now.
  virtual void after_runner_part(const LayerPlan& plan, int end, cudaStream_t stream) {
    (void)plan, (void)end, (void)stream;
  }
};

struct ForwardOptions {
  int max_tokens = 2048;   // rows of one pass
  int max_model_len = 0;   // longest sequence (launch sizing of decode buckets)
  int max_seqs = 0;        // sequences of one pass (metadata tables; 0: max_tokens)
  int logits_rows = 256;   // lm_head rows per launch (and the logits buffer)
  LaunchOptions launch;    // programmatic dependent launch, ...
  DeviceComm* comm = nullptr;  // tensor parallelism: this rank's collectives (ForwardModel)
};

class Forward {
 public:
  Forward(std::shared_ptr<const PreparedWeights> weights, DeviceKvCache& cache, const ForwardOptions& opt);

  const ForwardModel& model() const { return model_; }
  const ModelSpec& spec() const { return model_.spec(); }
  Activations& act() { return act_; }
  const ForwardOptions& options() const { return opt_; }
  int table_width() const { return table_width_; }  // block-table columns of decode buckets

  // Copies a pass's metadata and token ids into the fixed device buffers (asynchronous on stream).
  void upload(const StepMetadata& m, std::span<const int32_t> ids, cudaStream_t stream);
  // The metadata view of the last upload; a decode bucket's view (launches sized for
  // max_model_len, tables of table_width() columns).
  StepMetadataView view() const { return meta_.view(); }
  StepMetadataView bucket_view(int rows) const;

  // The plan of decode bucket `rows` (built on first use, then the same object: its pointers are
  // the fixed buffers), ending with lm_head over all rows.
  const LayerPlan& bucket_plan(int rows);
  // An eager pass over the uploaded metadata (launches sized for its own longest context).
  LayerPlan pass_plan() { return build_layer_plan(model_, act_, PlanShape{meta_.view().num_tokens, meta_.view(), false}); }

  // Enqueues the plan's ops on stream. With a runner, the sparse range's layers are its (the
  // plan's ops for them are skipped). obs (may be null) sees every op launched here. cuts (layers in
  // (first, last] of the sparse range) run the range in parts: after the part ending at cut c, obs
  // sees after_runner_part(plan, c) (a copy of what it left, native/aux_capture.h).
  void run(const LayerPlan& plan, cudaStream_t stream, PlanObserver* obs = nullptr, LayerRangeRunner* runner = nullptr,
           std::span<const int> cuts = {});
  // Runs plan ops [begin, end) (no runner).
  void run_ops(const LayerPlan& plan, int begin, int end, cudaStream_t stream, PlanObserver* obs = nullptr);

 private:
  ForwardOptions opt_;
  ForwardModel model_;
  Activations act_;
  DeviceStepMetadata meta_;
  int table_width_ = 0;
  std::vector<std::unique_ptr<LayerPlan>> bucket_plans_;  // by rows
};

}  // namespace m3::native
