// Recording of a traced step's discrete choices (runtime/backend.h SelectionTrace, and the
// indexer's block scores: cuda_backend.h BlockScoreTrace) as a plan observer: after each op that
// produced one, its outputs for the pass's live rows are copied back (synchronously: traced steps
// run eagerly). Per sparse layer the selected blocks (after the indexer's top-k, or after the
// attention split where its items select them: AttentionParams::topk_scores), per MoE layer the
// routed experts (after routing), per layer on request the cache entries the pass wrote (after
// the cache insert).
#pragma once
#include <cstdint>
#include <vector>

#include "native/forward.h"
#include "runtime/backend.h"

namespace m3::native {

struct BlockScoreTrace;

class StepTraceRecorder final : public PlanObserver {
 public:
  // sel: the step's trace (layers / moe_layers set up by begin()); scores optional.
  StepTraceRecorder(Forward& fw, SelectionTrace* sel, BlockScoreTrace* scores);
  // Clears the trace and lists its layers (once per step, before the first pass).
  void begin();
  // The pass about to run: its live rows, their positions and slots (host copies).
  void set_pass(int live_rows, const std::vector<int32_t>* positions, const std::vector<int32_t>* slots);
  void after(const OpCall& op, cudaStream_t stream) override;

 private:
  // The selected blocks [T, G, K] (and the block scores [T, G, mqb], block size bs) of a layer.
  struct BlockLists {
    const int32_t* selected;
    const float* block_scores;
    int T, G, K, bs, mqb;
  };
  void record_blocks(const BlockLists& b, int layer, cudaStream_t s);
  void record_experts(const kernels::RouterSelectParams& p, int layer, cudaStream_t s);
  void record_cache(int layer, cudaStream_t s);
  Forward& fw_;
  SelectionTrace* sel_;
  BlockScoreTrace* scores_;
  int live_ = 0;
  const std::vector<int32_t>* positions_ = nullptr;
  const std::vector<int32_t>* slots_ = nullptr;
};

}  // namespace m3::native
