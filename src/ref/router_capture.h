// Capturing router inputs for the router rounding probe (ref/router_probe.h): the CPU reference,
// with the checkpoint's own (FP32) router, prefills a prompt and decodes greedily, and the
// post-attention-norm rows entering the chosen MoE layers are copied out through RefOptions'
// FFN tap (ref/ffn_tap.h). Row r of every layer is the token at position r: the prompt's rows,
// then one row per fed greedy token.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/spec.h"
#include "model/weights.h"

namespace m3::ref {

struct RouterCapture {
  int hidden = 0;
  std::vector<int> layers;                // the layers asked for, in that order
  std::vector<std::vector<float>> rows;   // [i] -> [n_rows, hidden]: layer layers[i]'s router inputs
  std::vector<int32_t> tokens;            // [n_rows]: the token fed at each position
  int n_rows() const { return int(tokens.size()); }
  const float* layer_rows(int i) const { return rows[size_t(i)].data(); }
};

struct CaptureOptions {
  int threads = 0;                                   // CPU reference threads (0: all cores)
  std::function<void(int step, int steps)> progress;  // after each forward step
};

// Feeds the prompt and `decode` >= 0 greedy tokens (so prompt + decode rows per layer; decode + 1
// forward steps). Every entry of `layers` must be a MoE layer of spec, listed once.
RouterCapture capture_router_inputs(const ModelSpec& spec, ModelWeights w, const std::vector<int32_t>& prompt,
                                    int decode, const std::vector<int>& layers, const CaptureOptions& opt = {});

}  // namespace m3::ref
