// A short rendering of a JSON value for error messages (what a bad field held).
// NOTE: json::dump recurses once per nesting level of the value, so dumping a hostile file's value
// nested 60 000 deep overflows the stack (an index or config.json that is one deep array: found
// while reviewing the loader for fuzz_checkpoint, kept as its regress-deep-* seeds), and it
// renders a huge value whole only for the message to cut it. json_brief recurses at most
// kJsonBriefDepth levels (deeper containers show as [...] / {...}) and stops once `limit`
// characters are out; below those bounds it prints exactly what compact dump() prints.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace m3 {

inline constexpr int kJsonBriefDepth = 4;

namespace detail {
inline void json_brief_into(const nlohmann::json& j, std::string& out, size_t limit, int depth) {
  using json = nlohmann::json;
  if (!j.is_structured()) {
    out += j.dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  const bool obj = j.is_object();
  if (j.empty() || depth >= kJsonBriefDepth) {
    out += obj ? (j.empty() ? "{}" : "{...}") : (j.empty() ? "[]" : "[...]");
    return;
  }
  out += obj ? '{' : '[';
  bool first = true;
  for (auto it = j.begin(); it != j.end() && out.size() <= limit; ++it) {
    if (!first) out += ',';
    first = false;
    if (obj) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
    json_brief_into(*it, out, limit, depth + 1);
  }
  out += obj ? '}' : ']';
}
}  // namespace detail

// At most `limit` (>= 3) characters: longer renderings keep their first limit - 3 and end in "...".
inline std::string json_brief(const nlohmann::json& j, size_t limit = 80) {
  std::string s;
  detail::json_brief_into(j, s, limit, 0);
  if (s.size() > limit) s = s.substr(0, limit - 3) + "...";
  return s;
}

}  // namespace m3
