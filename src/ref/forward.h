// The decoder layers of the CPU reference over one planned step (docs m3-model.md, "One decoder
// layer"): attention block (norm, q/k/v, per-head norms, RoPE, cache append, full attention or MSA,
// O projection, residual) and FFN block (norm, dense SwiGLU-OAI or MoE, residual).
#pragma once
#include <vector>

#include "core/parallel.h"
#include "model/spec.h"
#include "model/weights.h"
#include "ref/cache_codec.h"
#include "ref/ffn_tap.h"
#include "ref/follow.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace m3::ref {

struct ForwardContext {
  const ModelSpec& spec;
  const ModelWeights& w;
  PagedCache& cache;
  const Rope& rope;
  ThreadPool& pool;
  const CacheCodecs* codecs = nullptr;  // rounding of what is written into the caches (null: exact)
  const Follow* follow = nullptr;       // decisions offered for this step (null: none)
  const FfnInputTap* ffn_tap = nullptr;  // sees every layer's FFN input (null: none)
  // Tensor parallelism (model/tp_shard.h): spec and w are this rank's shard; the partial outputs of
  // the O projection and of the FFN are summed over the ranks (in rank order) before the residual
  // add, and the vocabulary-parallel logits are gathered. Null: one rank.
  Communicator* comm = nullptr;
};

using BlockChoices = std::vector<std::vector<std::vector<int32_t>>>;  // [token][group] -> block ids
using ExpertChoices = std::vector<std::vector<int32_t>>;              // [token] -> expert ids

// What attention_block reports and follows for one layer (every part optional).
struct AttentionChoices {
  BlockChoices* sel = nullptr;             // out: the indexer's choice used, [token][group] ascending ids
  const BlockChoices* offered = nullptr;   // in (sparse layers): block sets to follow
  std::vector<float>* k_out = nullptr;     // out: the new tokens' cache entries as read back,
  std::vector<float>* v_out = nullptr;     //      [token * kv_dim + i] / [token * index_dim + i]
  std::vector<float>* ik_out = nullptr;
  const std::vector<float>* k_in = nullptr;   // in: cache entries to follow, same layouts
  const std::vector<float>* v_in = nullptr;
  const std::vector<float>* ik_in = nullptr;
};

// x: the residual stream [plan.num_tokens, hidden], updated in place. Offered choices (block sets,
// cache entries) are taken where they are near-ties of the reference's own (ref/follow.h; counted
// in c.follow->stats); the outputs receive what was actually used.
void attention_block(const ForwardContext& c, int layer, const StepPlan& plan, float* x,
                     const AttentionChoices& ch = {});
// MoE layers: offered / experts as above for the router's expert lists.
void ffn_block(const ForwardContext& c, int layer, int n_tok, float* x, ExpertChoices* experts = nullptr,
               const ExpertChoices* offered = nullptr);

// Embedding lookup, every layer, then final norm and lm_head for plan.out_tokens. The trace, when
// given, receives the choices used (blocks of sparse layers, experts of MoE layers); c.follow's
// decisions must have this step's shape (its blocks / experts parts may each be empty).
StepOutput forward_step(const ForwardContext& c, const StepPlan& plan, SelectionTrace* trace);

}  // namespace m3::ref
