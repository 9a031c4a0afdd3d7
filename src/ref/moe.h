// Mixture of experts with a sigmoid router and a correction bias (docs m3-model.md, "FFN"):
//   s = sigmoid(Wr y) (router weight fp32), experts chosen by top-k of s + bias (the bias only
//   chooses; ties to the lower expert id), weights s_i / sum_chosen s * routed_scale,
//   FFN(y) = sum_k w_k Expert_k(y) + Shared(y) (shared expert not scaled).
#pragma once
#include <vector>

#include "core/parallel.h"
#include "model/spec.h"
#include "model/weights.h"
#include "ref/follow.h"

namespace m3::ref {

struct Route {
  std::vector<int> experts;     // top_k ids, best choice first
  std::vector<float> weights;   // matching combine weights (already times routed_scale)
};

// From one token's router logits [E] and correction bias [E].
Route route_token(const float* logits, const float* bias, int num_experts, int top_k, float routed_scale);

// The scores route_token ranks by, in double: s[e] = sigmoid(logits[e]), choice[e] = s[e] + bias[e].
void router_scores(const float* logits, const float* bias, int num_experts, double* s, double* choice);

// The route through the given experts (in that order), weights from this token's own scores.
Route route_through(const float* logits, const std::vector<int32_t>& experts, float routed_scale);

// Optional extras of moe_forward: expert lists offered by another backend (followed per
// ref/follow.h, counted in stats) and the lists actually used.
struct MoeChoices {
  const std::vector<std::vector<int32_t>>* offered = nullptr;  // [token] -> top-k ids, best first
  double tie_rel = kTieRel;
  FollowStats* stats = nullptr;                        // required with offered
  int layer = -1;                                      // for messages
  std::vector<std::vector<int32_t>>* chosen = nullptr;  // out: [token] -> ids used, best first
};

// out[t, :] = FFN(x[t, :]) for n_tok rows of width spec.hidden (a MoE layer's weights).
void moe_forward(const ModelSpec& spec, const LayerWeights& lw, const float* x, int n_tok, float* out,
                 ThreadPool& pool, const MoeChoices* choices = nullptr);

}  // namespace m3::ref
