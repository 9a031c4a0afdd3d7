// libFuzzer target: a /v1/completions request body (arbitrary bytes) -> parse_completion_request,
// the function the server answers with (no engine, no HTTP). Contract:
//  - nothing escapes it (it is meant to catch everything itself);
//  - either a request every field of which is in range for these limits (and for what the
//    scheduler's validate() demands), or an ApiError with a 4xx status, a message, a param naming a
//    request field (or none), a known code (or none), and a JSON body (error_json) that parses
//    back to the same message;
//  - the caps come first: a body over max_body_bytes is 413 body_too_large, one nested deeper than
//    max_json_depth is json_too_deep, and json_nesting_depth agrees with the parser's own depth on
//    every valid JSON text;
//  - a JSON syntax error is reported as invalid_json (or invalid_utf8 when it is ill-formed UTF-8
//    inside a string; its param is then the top-level key it sits in, any string), and valid JSON
//    never is.
// Any broken rule is a __builtin_trap (a crash libFuzzer keeps).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/completion_api.h"

namespace {

using nlohmann::json;
using m3::serve::ApiError;
using m3::serve::ApiLimits;
using m3::serve::CompletionParams;

// The limits of the tiny test model behind a server (tests/cpu/test_server_http.cpp), with a body
// cap and depth cap small enough that inputs of the fuzzer's -max_len reach both sides of each.
const ApiLimits& limits() {
  static const ApiLimits l = [] {
    ApiLimits x;
    x.model = "tiny";
    x.vocab_size = 1024;
    x.max_model_len = 64;
    x.max_prompt_tokens = 48;
    x.max_completion_tokens = 32;
    x.max_prompts = 4;
    x.max_body_bytes = 6000;
    x.max_json_depth = 8;
    return x;
  }();
  return l;
}

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// The deepest array/object nesting the parser itself sees (an iterative SAX walk).
struct DepthSax : nlohmann::json_sax<json> {
  int depth = 0, deepest = 0;
  bool open() {
    if (++depth > deepest) deepest = depth;
    return true;
  }
  bool close() {
    --depth;
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

bool in_vocab(int32_t id) { return id >= 0 && id < limits().vocab_size; }

void check_request(const CompletionParams& p) {
  const ApiLimits& l = limits();
  require(!p.prompts.empty() && p.prompts.size() <= size_t(l.max_prompts));
  require(p.n >= 1 && p.choices() == p.prompts.size() * size_t(p.n) && p.choices() <= size_t(l.max_prompts));
  require(p.max_tokens >= 1 && p.max_tokens <= l.max_completion_tokens);
  require(std::isfinite(p.temperature) && p.temperature >= 0 && p.temperature <= 2);
  require(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1);
  require(p.top_k >= 0 && p.top_k <= l.vocab_size);
  require(p.stream || !p.include_usage);
  require(p.logprobs >= -1 && p.logprobs <= m3::kMaxLogprobs);
  for (int32_t id : p.stop_token_ids) require(in_vocab(id));
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    const auto& pr = p.prompts[i];
    require(!pr.empty() && pr.size() <= size_t(l.max_prompt_tokens));
    require(int64_t(pr.size()) + p.max_tokens <= l.max_model_len);
    for (int32_t id : pr) require(in_vocab(id));
  }
  // the engine request of each choice carries the same numbers, choice c sampling prompt c / n
  for (size_t c = 0; c < p.choices(); ++c) {
    m3::GenerationRequest r = p.request(c, 12345);
    require(r.prompt == p.prompts[c / size_t(p.n)] && r.max_tokens == p.max_tokens && r.stop_token_ids == p.stop_token_ids);
    require(r.sampling.temperature == p.temperature && r.sampling.top_p == p.top_p && r.sampling.top_k == p.top_k);
    require(r.sampling.seed == (p.seed ? *p.seed + c % size_t(p.n) : 12345u) && r.ignore_eos == p.ignore_eos);
    require(r.logprobs == p.logprobs);
  }
}

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

void check_error(const ApiError& e) {
  require(e.status >= 400 && e.status < 500);
  require(!e.message.empty() && !e.type.empty());
  // param names a request field (or none), code is one the API documents (or none)
  require(e.code == "invalid_utf8" ||
          one_of(e.param, {"", "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "n",
                           "best_of", "echo", "logprobs", "suffix", "presence_penalty", "frequency_penalty",
                           "logit_bias", "stop", "stop_token_ids", "ignore_eos", "user", "stream", "stream_options",
                           "stream_options.include_usage", "add_special_tokens", "skip_special_tokens"}));
  require(one_of(e.code, {"", "invalid_json", "invalid_utf8", "json_too_deep", "body_too_large", "model_not_found",
                          "no_tokenizer", "empty_prompt", "invalid_token_id", "context_length_exceeded"}));
  // what the server sends: must serialize (valid UTF-8) and say the same thing
  json j = json::parse(m3::serve::error_json(e));
  require(j["error"]["message"] == e.message && j["error"]["type"] == e.type);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const ApiLimits& l = limits();
  ApiError err;
  std::optional<CompletionParams> p;
  try {
    p = m3::serve::parse_completion_request(body, l, err);
  } catch (...) {
    __builtin_trap();  // nothing may escape
  }
  if (p) check_request(*p);
  else check_error(err);

  // the caps, before anything else
  const int depth = m3::serve::json_nesting_depth(body, l.max_json_depth);
  require(depth >= 0 && depth <= l.max_json_depth + 1);
  if (size > l.max_body_bytes) {
    require(!p && err.status == 413 && err.code == "body_too_large");
    return 0;
  }
  if (depth > l.max_json_depth) {
    require(!p && err.status == 400 && err.code == "json_too_deep");
    return 0;
  }
  // within the caps: the scanner's depth is exact on valid JSON, and only invalid JSON is invalid_json
  // (nlohmann's lexer stops at a NUL byte as if the input ended there; JSON never holds one)
  DepthSax sax;
  const bool valid = body.find('\0') == std::string_view::npos &&
                     json::sax_parse(body, &sax, json::input_format_t::json, /*strict=*/true);
  if (valid) require(sax.deepest == depth && (p || (err.code != "invalid_json" && err.code != "invalid_utf8")));
  else require(!p && (err.code == "invalid_json" || err.code == "invalid_utf8"));
  return 0;
}
