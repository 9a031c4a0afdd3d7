// libFuzzer target: config.json parsing (parse_model_spec_json) on arbitrary text. Contract: a
// valid ModelSpec (validate() passes) or an m3::Error; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    m3::ModelSpec s = m3::parse_model_spec_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    s.validate();  // whatever parses must be valid
    if (s.attn.size() != size_t(s.num_layers)) __builtin_trap();
  } catch (const m3::Error&) {
  }
  return 0;
}
