// The native GPU path's layers over BORROWED device tensors: the library level's NativeLayers on the
// GPU (issue 16; python: m3mono.NativeLayers with device="cuda"). A host framework owns the prepared
// weights (by tensor name: model/prepared_tensors.h, PreparedWeights::borrow) and the paged device
// caches (DeviceKvCache's borrowing constructor); this object owns only its activations and step
// metadata (scratch), and drives one pass at a time:
//   prepare_step(batch)             the step's token rows and tables (one pass: at most max_tokens)
//   embed(x)                        x [T][hidden] fp32 = the embeddings of the step's tokens
//   forward_layers(first, last, x)  layers [first, last) over the residual stream x, in place
//   logits(x, out)                  out [R][vocab] fp32: final norm and lm_head of the rows that
//                                   return logits (the last token of each sequence, or every token
//                                   of an all_logits one), in output order
// Everything is enqueued on the caller's stream (nothing synchronizes but prepare_step's host
// copies), so the layer calls capture into a CUDA graph. The ops are the native plan's, built with
// the norms unfused (each layer starts from its own input norm, so a layer range is self-contained:
// the same bits as the fused plans, kernels/fused_norm_params.h), so the logits are the engine's.
// Decode-sized steps (every sequence at most kFixedQueryLen query tokens: decode and verify rows)
// run a plan kept per row count whose launches are sized for max_model_len (the engine's decode
// buckets' rule), so a graph captured over one such step replays for any later step of the same
// rows and sequences after its prepare_step; a prefill step gets a plan of its own.
// A LayerRangeRunner (the mono path: the library level's m3mono.Mono) may take the layers of the
// model's sparse range: forward_layers hands it the part of [first, last) inside that range.
// At tensor parallelism each rank's object runs on its own thread, the same calls in the same order.
#pragma once
#include <map>
#include <memory>

#include "native/device_comm.h"
#include "native/forward.h"
#include "native/layer_range.h"
#include "runtime/backend.h"

namespace m3::native {

class DeviceLayers {
 public:
  // max_tokens: rows of one pass; max_model_len: the longest sequence (attention chunk sizes: the
  // engine's bits when it equals the engine's). comm: tensor parallelism (weights and caches are
  // this rank's shard; the plan's rank sums and the logits' vocabulary gather go through it, so
  // every rank calls the same layer ranges' collectives in the same order: any cuts of the model,
  // as long as every rank runs every layer and the logits of each step). Null: one rank.
  DeviceLayers(std::shared_ptr<const PreparedWeights> weights, std::unique_ptr<DeviceKvCache> cache, int max_tokens,
               int max_model_len, std::shared_ptr<DeviceComm> comm = nullptr);

  static constexpr int kFixedQueryLen = 4;

  // The runner of the sparse range (after construction: it is made over model()); null: native.
  // prepare_step then refuses a step the runner refuses, naming its reason.
  void set_runner(std::unique_ptr<LayerRangeRunner> runner);
  LayerRangeRunner* runner() const { return runner_.get(); }

  const ModelSpec& spec() const { return fw_->spec(); }
  int num_tokens() const { return plan_ ? plan_->shape.rows : 0; }
  int num_out_rows() const { return int(out_rows_.size()); }
  DeviceKvCache& cache() { return *cache_; }
  const ForwardModel& model() const { return fw_->model(); }

  void prepare_step(const StepBatch& batch, cudaStream_t stream);
  void embed(float* x, cudaStream_t stream);
  void forward_layers(int first, int last, float* x, cudaStream_t stream);
  void logits(const float* x, float* out, cudaStream_t stream);

 private:
  void load_x(const float* x, cudaStream_t stream);
  const char* who() const;  // "NativeLayers", or "Mono" with a runner (error messages)
  const LayerPlan& plan(const char* what) const;

  void run_range(const LayerPlan& p, int first, int last, cudaStream_t stream);

  std::shared_ptr<DeviceComm> comm_;  // outlives the Forward whose plans name it
  std::unique_ptr<DeviceKvCache> cache_;
  std::unique_ptr<Forward> fw_;
  const LayerPlan* plan_ = nullptr;               // the prepared step's: one of the two below
  std::map<int, std::unique_ptr<LayerPlan>> fixed_;  // decode-sized plans by rows (stable addresses)
  std::unique_ptr<LayerPlan> pass_;               // the last prefill step's
  std::unique_ptr<LayerRangeRunner> runner_;  // declared after the plans: destroyed before them
  std::vector<int32_t> out_rows_;
};

}  // namespace m3::native
