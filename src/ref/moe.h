// Mixture of experts with a sigmoid router and a correction bias (docs m3-model.md, "FFN"):
//   s = sigmoid(Wr y) (router weight fp32), experts chosen by top-k of s + bias (the bias only
//   chooses; ties to the lower expert id), weights s_i / sum_chosen s * routed_scale,
//   FFN(y) = sum_k w_k Expert_k(y) + Shared(y) (shared expert not scaled).
#pragma once
#include <vector>

#include "core/parallel.h"
#include "model/spec.h"
#include "model/weights.h"

namespace m3::ref {

struct Route {
  std::vector<int> experts;     // top_k ids, best choice first
  std::vector<float> weights;   // matching combine weights (already times routed_scale)
};

// From one token's router logits [E] and correction bias [E].
Route route_token(const float* logits, const float* bias, int num_experts, int top_k, float routed_scale);

// out[t, :] = FFN(x[t, :]) for n_tok rows of width spec.hidden (a MoE layer's weights).
void moe_forward(const ModelSpec& spec, const LayerWeights& lw, const float* x, int n_tok, float* out,
                 ThreadPool& pool);

}  // namespace m3::ref
