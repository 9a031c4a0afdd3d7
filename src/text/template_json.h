#pragma once
// JSON <-> template values: the render context comes in as JSON, and the tojson filter writes
// values out exactly as Python's json.dumps does (transformers' override: ensure_ascii=False).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/template_value.h"

namespace m3::text::tmpl {

// ordered_json keeps object keys in document order (as Python's json.loads does); plain json
// sorts them.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // none: one line
  std::optional<std::string> item_separator;  // default ", " (or "," with indent)
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(v, ...); raises ValueError for values JSON cannot hold (undefined, macros, ...).
std::string dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace m3::text::tmpl
