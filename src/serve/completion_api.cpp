// /v1/completions request validation and response JSON.
#include "serve/completion_api.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace m3::serve {

using nlohmann::json;

std::string error_json(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return j.dump();
}

GenerationRequest CompletionParams::request(size_t i, uint64_t fallback_seed) const {
  GenerationRequest r;
  r.prompt = prompts.at(i);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_p = top_p;
  r.sampling.top_k = top_k;
  r.sampling.seed = seed ? *seed : fallback_seed;
  r.stop_token_ids = stop_token_ids;
  r.ignore_eos = ignore_eos;
  return r;
}

namespace {

// Thrown inside the parser and turned into the ApiError the caller gets.
struct Bad {
  ApiError e;
};
[[noreturn]] void bad(std::string param, std::string message, std::string code = "", int status = 400) {
  ApiError e;
  e.status = status;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  throw Bad{std::move(e)};
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

// Field present and not null.
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

const char* kNoTokenizer =
    "this checkpoint has no tokenizer: send 'prompt' as a list of token ids (or a list of such lists)";

// `name` is how messages spell the list ("prompt[2]"); `param` the request field it belongs to.
std::vector<int32_t> token_list(const json& arr, const std::string& name, const std::string& param, int vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    std::string p = fmt::format("{}[{}]", name, i);
    if (t.is_string()) bad(param, kNoTokenizer, "no_tokenizer");
    if (!t.is_number_integer())
      bad(param, fmt::format("'{}' must be an integer token id, got {}", p, type_name(t)));
    // (an id past INT64_MAX is outside the vocabulary too, not a bad 'prompt[i]' field of its own)
    const bool outside = t.is_number_unsigned() ? t.get<uint64_t>() >= uint64_t(vocab)
                                                : t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab;
    if (outside)
      bad(param, fmt::format("'{}' = {} is outside the vocabulary [0, {})", p, t.dump(), vocab), "invalid_token_id");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

CompletionParams parse(std::string_view body, const ApiLimits& lim) {
  if (body.size() > lim.max_body_bytes) throw Bad{body_too_large_error(lim.max_body_bytes)};
  if (json_nesting_depth(body, lim.max_json_depth) > lim.max_json_depth)
    bad("", fmt::format("the request body is nested deeper than {} levels of arrays and objects", lim.max_json_depth),
        "json_too_deep");
  // nlohmann's lexer takes a NUL byte for the end of the input and ignores what follows (so
  // `{...}\0garbage` parsed as `{...}`; found by fuzz_completion_request). JSON never holds a raw
  // NUL, not even inside a string.
  if (body.find('\0') != std::string_view::npos)
    bad("", "the request body is not valid JSON (it holds a NUL byte)", "invalid_json");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("", "the request body is not valid JSON", "invalid_json");
  if (!j.is_object()) bad("", fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  CompletionParams p;

  const json* model = field(j, "model");
  if (!model) bad("model", "'model' is required");
  if (!model->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*model)));
  if (model->get<std::string>() != lim.model)
    bad("model", fmt::format("the model '{}' does not exist; this server serves '{}'", model->get<std::string>(), lim.model),
        "model_not_found", 404);

  const json* prompt = field(j, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  if (prompt->is_string()) bad("prompt", kNoTokenizer, "no_tokenizer");
  if (!prompt->is_array())
    bad("prompt", fmt::format("'prompt' must be a list of token ids, got {}", type_name(*prompt)));
  if (prompt->empty()) bad("prompt", "'prompt' is empty", "empty_prompt");
  if ((*prompt)[0].is_array()) {
    if (prompt->size() > size_t(lim.max_prompts))
      bad("prompt", fmt::format("at most {} prompts per request, got {}", lim.max_prompts, prompt->size()));
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& one = (*prompt)[i];
      std::string pp = fmt::format("prompt[{}]", i);
      if (one.is_string()) bad("prompt", kNoTokenizer, "no_tokenizer");
      if (!one.is_array()) bad("prompt", fmt::format("'{}' must be a list of token ids, got {}", pp, type_name(one)));
      if (one.empty()) bad("prompt", fmt::format("'{}' is empty", pp), "empty_prompt");
      p.prompts.push_back(token_list(one, pp, "prompt", lim.vocab_size));
    }
  } else {
    p.prompts.push_back(token_list(*prompt, "prompt", "prompt", lim.vocab_size));
  }

  const bool max_tokens_given = field(j, "max_tokens") != nullptr;
  if (const json* v = field(j, "max_tokens")) {
    int64_t m = as_int(*v, "max_tokens");
    if (m < 1) bad("max_tokens", fmt::format("'max_tokens' must be at least 1, got {}", m));
    if (m > lim.max_completion_tokens)
      bad("max_tokens", fmt::format("'max_tokens' = {} exceeds this server's limit of {}", m, lim.max_completion_tokens));
    p.max_tokens = int(m);
  }
  if (!max_tokens_given)  // the default (16) shrinks to what the context leaves; an explicit value never does
    for (const auto& pr : p.prompts)
      p.max_tokens = int(std::max<int64_t>(1, std::min<int64_t>(p.max_tokens, lim.max_model_len - int64_t(pr.size()))));
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    int64_t n = int64_t(p.prompts[i].size());
    std::string which = p.prompts.size() > 1 ? fmt::format("prompt[{}]", i) : "the prompt";
    if (n > lim.max_prompt_tokens)
      bad("prompt", fmt::format("{} has {} tokens; this server accepts at most {}", which, n, lim.max_prompt_tokens),
          "context_length_exceeded");
    if (n + p.max_tokens > lim.max_model_len)
      bad("max_tokens",
          fmt::format("this model's maximum context length is {} tokens, but {} tokens were requested ({} in {}, {} "
                      "for the completion)",
                      lim.max_model_len, n + p.max_tokens, n, which, p.max_tokens),
          "context_length_exceeded");
  }

  if (const json* v = field(j, "temperature")) {
    double t = as_number(*v, "temperature");
    if (t < 0 || t > 2) bad("temperature", fmt::format("'temperature' must be in [0, 2], got {}", t));
    p.temperature = float(t);
  }
  if (const json* v = field(j, "top_p")) {
    double t = as_number(*v, "top_p");
    if (!(t > 0 && t <= 1)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", t));
    p.top_p = float(t);
  }
  if (const json* v = field(j, "top_k")) {
    int64_t k = as_int(*v, "top_k");
    if (k < -1) bad("top_k", fmt::format("'top_k' must be -1 or 0 (off) or a positive count, got {}", k));
    p.top_k = k <= 0 ? 0 : int(std::min<int64_t>(k, lim.vocab_size));
  }
  if (const json* v = field(j, "seed")) p.seed = uint64_t(as_int(*v, "seed"));
  if (const json* v = field(j, "n")) {
    if (as_int(*v, "n") != 1) bad("n", "only n = 1 is supported");
  }
  if (const json* v = field(j, "best_of")) {
    if (as_int(*v, "best_of") != 1) bad("best_of", "only best_of = 1 is supported");
  }
  if (const json* v = field(j, "echo")) {
    if (as_bool(*v, "echo")) bad("echo", "'echo' is not supported");
  }
  if (const json* v = field(j, "logprobs")) {
    as_int(*v, "logprobs");
    bad("logprobs", "'logprobs' are not supported");
  }
  if (const json* v = field(j, "suffix")) {
    if (!v->is_string()) bad("suffix", fmt::format("'suffix' must be a string, got {}", type_name(*v)));
    if (!v->get<std::string>().empty()) bad("suffix", "'suffix' is not supported");
  }
  for (const char* pen : {"presence_penalty", "frequency_penalty"}) {
    if (const json* v = field(j, pen)) {
      double x = as_number(*v, pen);
      if (x < -2 || x > 2) bad(pen, fmt::format("'{}' must be in [-2, 2], got {}", pen, x));
      if (x != 0) bad(pen, fmt::format("'{}' is not supported (only 0)", pen));
    }
  }
  if (const json* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad("logit_bias", fmt::format("'logit_bias' must be an object, got {}", type_name(*v)));
    if (!v->empty()) bad("logit_bias", "'logit_bias' is not supported");
  }
  if (const json* v = field(j, "stop")) {
    bool empty = (v->is_string() && v->get<std::string>().empty()) || (v->is_array() && v->empty());
    if (!empty) {
      if (!v->is_string() && !v->is_array())
        bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", type_name(*v)));
      bad("stop", "stop strings need a tokenizer, which this checkpoint lacks: use 'stop_token_ids'", "no_tokenizer");
    }
  }
  if (const json* v = field(j, "stop_token_ids")) {
    if (!v->is_array()) bad("stop_token_ids", fmt::format("'stop_token_ids' must be a list of token ids, got {}", type_name(*v)));
    p.stop_token_ids = token_list(*v, "stop_token_ids", "stop_token_ids", lim.vocab_size);
  }
  if (const json* v = field(j, "ignore_eos")) p.ignore_eos = as_bool(*v, "ignore_eos");
  if (const json* v = field(j, "user")) {
    if (!v->is_string()) bad("user", fmt::format("'user' must be a string, got {}", type_name(*v)));
  }
  if (const json* v = field(j, "stream")) p.stream = as_bool(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!p.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!v->is_object()) bad("stream_options", fmt::format("'stream_options' must be an object, got {}", type_name(*v)));
    if (const json* u = field(*v, "include_usage")) p.include_usage = as_bool(*u, "stream_options.include_usage");
  }
  return p;
}

json choice_json(const ChoiceResult& c, bool continues) {
  return json{{"index", c.index},
              {"text", ids_text(c.tokens, continues)},
              {"token_ids", c.tokens},
              {"logprobs", nullptr},
              {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)},
              {"stop_reason", c.stop_token >= 0 ? json(c.stop_token) : json(nullptr)}};
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

ApiError body_too_large_error(size_t max_body_bytes) {
  return ApiError{413, fmt::format("the request body exceeds this server's limit of {} bytes", max_body_bytes),
                  "invalid_request_error", "", "body_too_large"};
}

int json_nesting_depth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest && (deepest = depth) > stop_above) return deepest;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return deepest;
}

std::optional<CompletionParams> parse_completion_request(std::string_view body, const ApiLimits& lim, ApiError& err) {
  try {
    return parse(body, lim);
  } catch (const Bad& b) {
    err = b.e;
    return std::nullopt;
  } catch (const std::exception& e) {  // e.g. a JSON type error this parser did not foresee
    err = ApiError{400, std::string("invalid request: ") + e.what(), "invalid_request_error", "", ""};
    return std::nullopt;
  } catch (...) {
    err = ApiError{400, "invalid request", "invalid_request_error", "", ""};
    return std::nullopt;
  }
}

std::string ids_text(const std::vector<int32_t>& ids, bool leading_space) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i || leading_space) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::string completion_json(const std::string& id, int64_t created, const std::string& model,
                            const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json cs = json::array();
  for (const auto& c : choices) cs.push_back(choice_json(c, false));
  json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", cs}, {"usage", usage_json(usage)}};
  return j.dump();
}

std::string chunk_json(const std::string& id, int64_t created, const std::string& model, const ChoiceResult& choice,
                       bool continues) {
  json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", json::array({choice_json(choice, continues)})}};
  return j.dump();
}

std::string usage_chunk_json(const std::string& id, int64_t created, const std::string& model, const Usage& usage) {
  json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", json::array()}, {"usage", usage_json(usage)}};
  return j.dump();
}

std::string models_json(const ApiLimits& lim, int64_t created) {
  json j = {{"object", "list"},
            {"data", json::array({json{{"id", lim.model},
                                       {"object", "model"},
                                       {"created", created},
                                       {"owned_by", "m3mono"},
                                       {"max_model_len", lim.max_model_len},
                                       {"vocab_size", lim.vocab_size}}})}};
  return j.dump();
}

}  // namespace m3::serve
