// Host fp32 weights of the whole text model: what the CPU reference computes with. Filled from a
// checkpoint (model/load_weights.cpp, via the weight table) or from prepared GPU weights
// dequantized (so the reference sees the same numbers as the GPU paths).
#pragma once
#include <cstddef>
#include <vector>

#include "model/spec.h"

namespace m3 {

struct Mat {  // row-major [rows, cols]; a linear layer y = W x has W as [out, in]
  int rows = 0, cols = 0;
  std::vector<float> data;
  Mat() = default;
  Mat(int r, int c) : rows(r), cols(c), data(size_t(r) * size_t(c)) {}
  const float* row(int r) const { return data.data() + size_t(r) * size_t(cols); }
  float* row(int r) { return data.data() + size_t(r) * size_t(cols); }
  bool empty() const { return data.empty(); }
};
using Vec = std::vector<float>;

struct MlpWeights {  // SwiGLU-OAI: gate [I, H], up [I, H], down [H, I]
  Mat gate, up, down;
};

struct LayerWeights {
  Vec input_norm, post_norm;   // [H]
  Mat wq, wk, wv;              // [nh*hd, H], [kvh*hd, H], [kvh*hd, H]
  Mat wo;                      // [H, nh*hd]
  Vec q_norm, k_norm;          // [hd]
  // sparse (MSA) layers only
  Mat wiq;                     // [ih*id, H]
  Mat wik;                     // [id, H]
  Vec iq_norm, ik_norm;        // [id]
  // dense MLP layers only
  MlpWeights dense;
  // MoE layers only
  Mat router;                  // [E, H] (fp32 in the checkpoint)
  Vec router_bias;             // [E] e_score_correction_bias
  std::vector<MlpWeights> experts;  // E entries
  MlpWeights shared;           // shared expert (empty when shared_inter == 0)
};

struct ModelWeights {
  Mat embed;     // [V, H]
  Mat lm_head;   // [V, H]
  Vec final_norm;  // [H]
  std::vector<LayerWeights> layers;
};

}  // namespace m3
