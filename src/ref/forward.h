// The decoder layers of the CPU reference over one planned step (docs m3-model.md, "One decoder
// layer"): attention block (norm, q/k/v, per-head norms, RoPE, cache append, full attention or MSA,
// O projection, residual) and FFN block (norm, dense SwiGLU-OAI or MoE, residual).
#pragma once
#include <vector>

#include "core/parallel.h"
#include "model/spec.h"
#include "model/weights.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"
#include "runtime/backend.h"

namespace m3::ref {

struct ForwardContext {
  const ModelSpec& spec;
  const ModelWeights& w;
  PagedCache& cache;
  const Rope& rope;
  ThreadPool& pool;
};

// x: the residual stream [plan.num_tokens, hidden], updated in place. When sel is given it receives
// the indexer's choice of each new token: sel[token][group] = ascending block ids.
void attention_block(const ForwardContext& c, int layer, const StepPlan& plan, float* x,
                     std::vector<std::vector<std::vector<int32_t>>>* sel);
void ffn_block(const ForwardContext& c, int layer, int n_tok, float* x);

// Embedding lookup, every layer, then final norm and lm_head for plan.out_tokens.
StepOutput forward_step(const ForwardContext& c, const StepPlan& plan, SelectionTrace* trace);

}  // namespace m3::ref
