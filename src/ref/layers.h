// The CPU reference's layers over BORROWED tensors: the library level's NativeLayers on the CPU
// (issue 16; python: m3mono.NativeLayers). The caller owns the prepared weights (by tensor name:
// model/prepared_tensors.h) and the paged fp32 caches, and drives the step:
//   prepare_step(batch)      the step's token rows (ref/step_plan.h), its slots counted as written
//   embed() -> x             the residual stream [T, hidden] of the step's tokens
//   forward_layer(l, x)      attention_block then ffn_block of layer l, x updated in place
//   logits(x) -> [R, vocab]  final norm and lm_head of the rows that return logits
// The same functions forward_step runs, on the same dequantized values (each layer's borrowed
// bytes are dequantized when the layer runs; no copy is kept), so a Python loop over the layers
// gives the engine's logits bit for bit. Tensor parallelism: with a communicator, this object is rank
// comm->rank() of comm->size() (the layout must be that rank's), computes with the rank's shapes and
// caches, sums the O projection's and the FFN's partial outputs over the ranks (in rank order) and
// gathers the logits, as the engine's ranks do; every rank calls every method in the same order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "model/prepare.h"
#include "model/prepared_tensors.h"
#include "ref/forward.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"
#include "runtime/backend.h"

namespace m3::ref {

// Where a named tensor's bytes are: (spec, data) for every tensor of a layer or of the model.
using BorrowedLayer = std::vector<std::pair<TensorSpec, const void*>>;

class RefLayers {
 public:
  // layers[l]: layer l's tensors, model: the embedding, lm_head and final norm (already checked
  // against the layout: model/prepared_tensors.h check_borrowed); caches: per layer K, V and (sparse
  // layers) index-K fp32 buffers of num_blocks * block_size rows.
  RefLayers(const PreparedLayout& layout, BorrowedLayer model, std::vector<BorrowedLayer> layers, int num_blocks,
            std::vector<float*> k, std::vector<float*> v, std::vector<float*> ik, int threads,
            std::shared_ptr<Communicator> comm = nullptr);

  // The shapes this rank computes with (model/tp_shard.h; the model's at one rank).
  const ModelSpec& spec() const { return spec_; }
  const StepPlan& plan() const { return plan_; }
  void prepare_step(const StepBatch& batch);
  std::vector<float> embed() const;
  void forward_layer(int layer, float* x);
  // [out rows][vocab]: the step's rows that return logits (the last token of each sequence, or
  // every token of an all_logits one), in output order.
  std::vector<float> logits(const float* x);

 private:
  ArenaReader reader_of(const BorrowedLayer& t) const;

  PreparedLayout layout_;
  ModelSpec spec_;
  std::shared_ptr<Communicator> comm_;
  BorrowedLayer model_;
  std::vector<BorrowedLayer> layers_;
  ThreadPool pool_;
  PagedCache cache_;
  Rope rope_;
  ModelWeights w_;  // the running layer's dequantized weights only (and the model's, once)
  StepPlan plan_;
  bool prepared_ = false;
};

}  // namespace m3::ref
