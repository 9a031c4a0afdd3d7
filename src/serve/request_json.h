// Reading fields of a JSON request body for the OpenAI-style endpoints: every problem becomes an
// ApiError (thrown as BadRequest inside a parser, caught at its boundary) whose param names the
// field and whose message says what was wrong.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "serve/completion_api.h"

namespace m3::serve::req {

struct BadRequest {
  ApiError e;
};
[[noreturn]] void bad(std::string param, std::string message, std::string code = "", int status = 400);

// "a string", "an integer", ... for messages.
const char* type_name(const nlohmann::json& v);
// The field, when present and not null.
const nlohmann::json* field(const nlohmann::json& body, const char* name);
int64_t as_int(const nlohmann::json& v, const std::string& param);
double as_number(const nlohmann::json& v, const std::string& param);
bool as_bool(const nlohmann::json& v, const std::string& param);

// The body as a JSON object, after the size and nesting caps of `lim` (413 / 400). A body that is
// not valid JSON is a 400 "invalid_json"; when the reason is ill-formed UTF-8 inside a string, the
// message says so and param names the top-level field it sits in.
nlohmann::json parse_body(std::string_view body, const ApiLimits& lim);

// The top-level key of the object `text` whose value holds byte `offset` ("" when none: the
// offset is outside any top-level value, or the text is not an object).
std::string top_level_key_at(std::string_view text, size_t offset);

// Runs `parse`, turning BadRequest and any other exception into `err` (status 4xx).
template <class T, class F>
std::optional<T> guarded(F&& parse, ApiError& err) {
  try {
    return parse();
  } catch (const BadRequest& b) {
    err = b.e;
  } catch (const std::exception& e) {
    err = ApiError{400, std::string("invalid request: ") + e.what(), "invalid_request_error", "", ""};
  } catch (...) {
    err = ApiError{400, "invalid request", "invalid_request_error", "", ""};
  }
  return std::nullopt;
}

}  // namespace m3::serve::req
