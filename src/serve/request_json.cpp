// Field readers and the guarded body parse shared by the request parsers.
#include "serve/request_json.h"

#include <cmath>
#include <fmt/format.h>

namespace m3::serve::req {

using nlohmann::json;

void bad(std::string param, std::string message, std::string code, int status) {
  ApiError e;
  e.status = status;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  throw BadRequest{std::move(e)};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    default: return "an unsupported value";
  }
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t as_int(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) bad(param, fmt::format("'{}' is too large", param));
    return int64_t(u);
  }
  if (!v.is_number_integer()) bad(param, fmt::format("'{}' must be an integer, got {}", param, type_name(v)));
  return v.get<int64_t>();
}

double as_number(const json& v, const std::string& param) {
  if (!v.is_number()) bad(param, fmt::format("'{}' must be a number, got {}", param, type_name(v)));
  double d = v.get<double>();
  if (!std::isfinite(d)) bad(param, fmt::format("'{}' must be finite", param));
  return d;
}

bool as_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) bad(param, fmt::format("'{}' must be a boolean, got {}", param, type_name(v)));
  return v.get<bool>();
}

std::string top_level_key_at(std::string_view text, size_t offset) {
  int depth = 0;
  bool in_string = false, escaped = false, top_is_object = false;
  size_t string_start = 0;
  std::string last_string, key;
  for (size_t i = 0; i < text.size() && i < offset; ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') {
        in_string = false;
        if (depth == 1) last_string.assign(text.substr(string_start, i - string_start));
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        string_start = i + 1;
        break;
      case '{':
      case '[':
        if (depth == 0) top_is_object = c == '{';
        ++depth;
        break;
      case '}':
      case ']':
        if (depth > 0) --depth;
        if (depth == 0) key.clear();
        break;
      case ':':
        if (depth == 1) key = last_string;
        break;
      case ',':
        if (depth == 1) key.clear();
        break;
      default: break;
    }
  }
  return top_is_object ? key : std::string();
}

json parse_body(std::string_view body, const ApiLimits& lim) {
  if (body.size() > lim.max_body_bytes) throw BadRequest{body_too_large_error(lim.max_body_bytes)};
  if (json_nesting_depth(body, lim.max_json_depth) > lim.max_json_depth)
    bad("", fmt::format("the request body is nested deeper than {} levels of arrays and objects", lim.max_json_depth),
        "json_too_deep");
  // nlohmann's lexer takes a NUL byte for the end of the input and ignores what follows (so
  // `{...}\0garbage` parsed as `{...}`; found by fuzz_completion_request). JSON never holds a raw
  // NUL, not even inside a string.
  if (body.find('\0') != std::string_view::npos)
    bad("", "the request body is not valid JSON (it holds a NUL byte)", "invalid_json");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number that overflows a double ("1e400": invalid JSON
    // here, as it was with the non-throwing parse; found by fuzz_completion_request's corpus)
    const std::string what = e.what();
    const auto* pe = dynamic_cast<const json::parse_error*>(&e);
    if (pe && (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos)) {
      // e.byte counts from 1 and points at (or just past) the offending byte
      const size_t at = pe->byte > 0 ? pe->byte - 1 : 0;
      std::string key = top_level_key_at(body, at);
      bad(key,
          fmt::format("{} is not valid UTF-8 text (ill-formed byte or \\u escape near byte {} of the body)",
                      key.empty() ? std::string("the request body") : "'" + key + "'", at),
          "invalid_utf8");
    }
    bad("", "the request body is not valid JSON", "invalid_json");
  }
  if (!j.is_object()) bad("", fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  return j;
}

}  // namespace m3::serve::req
