// An EAGLE3 draft model's shape (config.json of a LlamaForCausalLMEagle3 checkpoint, the layout vLLM
// reads for MiniMax-M3's published drafts such as Inferact/MiniMax-M3-EAGLE3): one Llama decoder
// layer whose attention reads [input_layernorm(embedding of the next token), hidden_norm(hidden)]
// (2 x hidden wide), the hidden being fc(the target's auxiliary hidden states of aux_layers,
// concatenated) on the first draft position and the draft's own pre-norm output after that; then
// a final RMS norm and the lm_head (its own over draft_vocab rows mapped by d2t, or the target's).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "model/spec.h"

namespace m3 {

struct Eagle3Spec {
  int hidden = 0;          // hidden_size
  int target_hidden = 0;   // target_hidden_size (default hidden)
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int intermediate = 0;    // intermediate_size (SiLU-gated MLP)
  int vocab = 0;           // vocab_size (the target's)
  int draft_vocab = 0;     // draft_vocab_size (default vocab)
  float rms_eps = 1e-6f;
  double rope_theta = 10000;
  // rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
  // original_max_position_embeddings}; factor 0 = none
  double rope_factor = 0, rope_low_freq = 1, rope_high_freq = 4;
  int rope_original_max = 8192;
  bool norm_before_residual = false;
  std::vector<int> aux_layers;  // eagle_config.eagle_aux_hidden_state_layer_ids (default 2, L/2, L-3)
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int fc_in() const { return int(aux_layers.size()) * target_hidden; }
};

// Reads DIR/config.json (or a .json path). `target` gives the defaults that depend on it (aux
// layers, vocab) and is checked against (hidden sizes, vocabulary, aux layers inside the model).
// Errors name the file, the field and the value.
Eagle3Spec load_eagle3_spec(const std::filesystem::path& path, const ModelSpec& target);
// config.json text of `s` (what make-tiny --eagle3 writes).
std::string eagle3_spec_to_json(const Eagle3Spec& s);
// RoPE's inverse frequencies [head_dim / 2] (Llama's; llama3 scaling when rope_factor > 0: long
// wavelengths slowed by the factor, a smooth ramp between the low and high frequency bounds).
std::vector<double> eagle3_inv_freq(const Eagle3Spec& s);
// The draft's default aux layers for a target of L layers: 2, L / 2, L - 3 (vLLM's) when L >= 6;
// smaller targets: L - 3 .. L - 1 (from 0, at most three, L itself when needed).
std::vector<int> eagle3_default_aux_layers(int num_layers);

}  // namespace m3
