// libFuzzer target: config.json parsing on arbitrary text: the model spec (parse_model_spec_json)
// and the quantization_config (parse_quant_config: names and globs as patterns, `re:` refused,
// layer rules in the file's order). Contract: a valid ModelSpec (validate() passes) or an m3::Error; a QuantConfig or
// an m3::Error, and a parsed config answers expected() for any module name (patterns matched
// against a few real module names and one built from the input) without throwing; nothing else
// may escape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "model/quant_config.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    m3::ModelSpec s = m3::parse_model_spec_json(text, "fuzz");
    s.validate();  // whatever parses must be valid
    if (s.attn.size() != size_t(s.num_layers)) __builtin_trap();
  } catch (const m3::Error&) {
  }
  try {
    const m3::QuantConfig q = m3::parse_quant_config(text, "fuzz");
    const std::string tail = text.substr(0, 64);
    for (const std::string& m : {std::string("language_model.model.layers.3.self_attn.q_proj"),
                                 std::string("language_model.model.layers.7.block_sparse_moe.experts.12.w2"),
                                 std::string("language_model.lm_head"), std::string("model.layers.0.mlp.gate"),
                                 "language_model." + tail}) {
      std::string why;
      const m3::WeightQuant w = q.expected(m, &why);
      if (why.empty() || int(w) > int(m3::WeightQuant::Fp8Tensor)) __builtin_trap();
    }
    (void)q.describe();
  } catch (const m3::Error&) {
  }
  return 0;
}
