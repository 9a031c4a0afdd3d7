// SwiGLU-OAI feed-forward (gate and up are separate matrices, NOT interleaved):
//   g = min(Wg y, limit), u = clamp(Wu y, -limit, limit), h = (u + 1) * g * sigmoid(alpha * g),
//   out = Wd h.
// Used by the dense MLP layers, every routed expert and the shared expert.
#pragma once
#include <vector>

#include "core/parallel.h"
#include "model/weights.h"

namespace m3::ref {

// The activation of one element (double inside, fp32 result).
float swiglu_oai(float gate, float up, float alpha, float limit);

// out[t, :] = MLP(x[t, :]) for n_tok rows of width w.gate.cols (x, out contiguous rows).
void mlp_forward(const MlpWeights& w, const float* x, int n_tok, float alpha, float limit, float* out,
                 ThreadPool& pool);

}  // namespace m3::ref
