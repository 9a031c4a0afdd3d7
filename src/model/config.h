// config.json <-> ModelSpec. Parsing is declared in model/spec.h (parse_model_spec_json,
// load_model_spec); this header adds the writer, used by the synthetic checkpoint generator and by
// tests that need a config in either spelling.
#pragma once
#include <string>

#include "model/spec.h"

namespace m3 {

enum class ConfigSpelling {
  Released,    // sparse_attention_config{sparse_*}, moe_layer_freq lists, rotary_dim/rope_theta top-level
  Normalized,  // what transformers writes: index_*, layer_types, mlp_layer_types, rope_parameters
};

// A config.json text for `spec`: {"model_type": "minimax_m3_vl", "text_config": {...}} when
// `nested`, the bare text config otherwise. parse_model_spec_json(model_spec_to_json(s, ...))
// gives back s for every valid spec.
std::string model_spec_to_json(const ModelSpec& spec, ConfigSpelling spelling, bool nested = true);

}  // namespace m3
