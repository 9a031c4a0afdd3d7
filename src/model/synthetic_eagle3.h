// A synthetic EAGLE3 draft for a target spec (`m3mono make-tiny --eagle3`, tests): config.json and
// model.safetensors in the layout vLLM reads (midlayer.*, fc, norm; BF16), random weights drawn from
// a seed. By default the draft shares the target's embedding and lm_head (as Inferact's MiniMax-M3
// draft does); `reduced_vocab` gives it its own lm_head over every other target id and the d2t map.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "model/eagle3_spec.h"
#include "model/spec.h"

namespace m3 {

struct SyntheticEagle3Options {
  uint64_t seed = 1;
  bool reduced_vocab = false;
  std::vector<int> aux_layers;  // empty: eagle3_default_aux_layers (fc reads this many target states)
  int num_heads = 4, num_kv_heads = 2;
  int head_dim = 0;  // 0: hidden / 4 (rounded down to even)
};

// The draft's shape for `target` (hidden as the target's, 4 query heads over 2 KV heads unless opt
// says otherwise, an MLP of twice the hidden size, the default aux layers).
Eagle3Spec synthetic_eagle3_spec(const ModelSpec& target, const SyntheticEagle3Options& opt = {});
// Writes DIR/config.json and DIR/model.safetensors; returns the spec written.
Eagle3Spec write_synthetic_eagle3(const std::filesystem::path& dir, const ModelSpec& target,
                                  const SyntheticEagle3Options& opt = {});

}  // namespace m3
