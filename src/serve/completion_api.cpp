// /v1/completions request validation and response JSON.
#include "serve/completion_api.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "serve/request_json.h"
#include "text/tokenizer.h"

namespace m3::serve {

using nlohmann::json;

// Decoded text is valid UTF-8 by construction (lossy decoding); should anything else slip in, it
// is written as U+FFFD rather than throwing mid-response.
static std::string safe_dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_json(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return safe_dump(j);
}

GenerationRequest CompletionParams::request(size_t c, uint64_t fallback_seed) const {
  GenerationRequest r;
  r.prompt = prompts.at(c / size_t(n));
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_p = top_p;
  r.sampling.top_k = top_k;
  r.sampling.seed = seed ? *seed + uint64_t(c % size_t(n)) : fallback_seed;
  r.stop_token_ids = stop_token_ids;
  r.ignore_eos = ignore_eos;
  r.logprobs = logprobs;
  return r;
}

namespace {

using req::bad;
using req::type_name;
using req::field;
using req::as_int;
using req::as_number;
using req::as_bool;

const char* kNoTokenizer =
    "this checkpoint has no tokenizer (no tokenizer.json in the model directory): send 'prompt' as a list of token "
    "ids (or a list of such lists)";

// `name` is how messages spell the list ("prompt[2]"); `param` the request field it belongs to.
std::vector<int32_t> token_list(const json& arr, const std::string& name, const std::string& param, int vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    std::string p = fmt::format("{}[{}]", name, i);
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

// One prompt: a string (encoded with the tokenizer) or a list of token ids.
std::vector<int32_t> one_prompt(const json& v, const std::string& name, const ApiLimits& lim, bool add_special) {
  if (v.is_string()) {
    if (!lim.tokenizer) bad("prompt", kNoTokenizer, "no_tokenizer");
    const std::string& s = v.get_ref<const std::string&>();
    if (s.empty()) bad("prompt", fmt::format("'{}' is an empty string", name), "empty_prompt");
    std::vector<int32_t> ids = lim.tokenizer->encode(s, add_special);
    if (ids.empty()) bad("prompt", fmt::format("'{}' encodes to no tokens", name), "empty_prompt");
    return ids;
  }
  if (!v.is_array())
    bad("prompt", fmt::format("'{}' must be {}, got {}", name,
                              lim.tokenizer ? "a string or a list of token ids" : "a list of token ids", type_name(v)));
  if (v.empty()) bad("prompt", fmt::format("'{}' is empty", name), "empty_prompt");
  if (v[0].is_string() && !lim.tokenizer) bad("prompt", kNoTokenizer, "no_tokenizer");
  return token_list(v, name, "prompt", lim.vocab_size);
}

std::vector<std::string> stop_strings(const json& v, const ApiLimits& lim) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > size_t(lim.max_stop_strings))
      bad("stop", fmt::format("at most {} stop strings, got {}", lim.max_stop_strings, v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string())
        bad("stop", fmt::format("'stop[{}]' must be a string, got {}", i, type_name(v[i])));
      out.push_back(v[i].get<std::string>());
    }
  } else {
    bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", type_name(v)));
  }
  std::erase_if(out, [](const std::string& s) { return s.empty(); });
  for (const auto& s : out)
    if (s.size() > size_t(lim.max_stop_bytes))
      bad("stop", fmt::format("a stop string is {} bytes long; at most {} are accepted", s.size(), lim.max_stop_bytes));
  if (!out.empty() && !lim.tokenizer)
    bad("stop", "stop strings need a tokenizer, which this checkpoint lacks (no tokenizer.json): use 'stop_token_ids'",
        "no_tokenizer");
  return out;
}

CompletionParams parse(std::string_view body, const ApiLimits& lim) {
  json j = req::parse_body(body, lim);
  CompletionParams p;
  p.text_output = lim.tokenizer != nullptr;

  const json* model = field(j, "model");
  if (!model) bad("model", "'model' is required");
  if (!model->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*model)));
  if (model->get<std::string>() != lim.model)
    bad("model", fmt::format("the model '{}' does not exist; this server serves '{}'", model->get<std::string>(), lim.model),
        "model_not_found", 404);

  bool add_special = true;
  if (const json* v = field(j, "add_special_tokens")) add_special = as_bool(*v, "add_special_tokens");
  if (const json* v = field(j, "skip_special_tokens")) p.skip_special_tokens = as_bool(*v, "skip_special_tokens");

  const json* prompt = field(j, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  if (prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_array() || (*prompt)[0].is_string())) {
    if (prompt->size() > size_t(lim.max_prompts))
      bad("prompt", fmt::format("at most {} prompts per request, got {}", lim.max_prompts, prompt->size()));
    for (size_t i = 0; i < prompt->size(); ++i)
      p.prompts.push_back(one_prompt((*prompt)[i], fmt::format("prompt[{}]", i), lim, add_special));
  } else {
    p.prompts.push_back(one_prompt(*prompt, "prompt", lim, add_special));
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
    const int64_t n = as_int(*v, "n");
    if (n < 1 || n > lim.max_prompts) bad("n", fmt::format("'n' must be in [1, {}], got {}", lim.max_prompts, n));
    if (p.prompts.size() * size_t(n) > size_t(lim.max_prompts))
      bad("n", fmt::format("{} prompts x n = {} make {} choices; this server makes at most {} per request",
                           p.prompts.size(), n, p.prompts.size() * size_t(n), lim.max_prompts));
    p.n = int(n);
  }
  if (const json* v = field(j, "best_of")) {
    if (as_int(*v, "best_of") != 1) bad("best_of", "only best_of = 1 is supported");
  }
  if (const json* v = field(j, "echo")) {
    if (as_bool(*v, "echo")) bad("echo", "'echo' is not supported");
  }
  if (const json* v = field(j, "logprobs"); v && !v->is_null()) {
    const int64_t k = as_int(*v, "logprobs");
    if (k < 0 || k > kMaxLogprobs) bad("logprobs", fmt::format("'logprobs' must be in [0, {}], got {}", kMaxLogprobs, k));
    p.logprobs = int(k);
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
  if (const json* v = field(j, "stop")) p.stop = stop_strings(*v, lim);
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

// The completions API's logprobs object: tokens, token_logprobs, top_logprobs (token -> logprob)
// and text_offset (each token's byte offset from the start of this piece).
json completion_logprobs_json(const std::vector<LogprobText>& lps) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  size_t at = 0;
  for (const auto& l : lps) {
    tokens.push_back(l.token);
    values.push_back(l.logprob);
    json t = json::object();
    for (const auto& [tok, lp] : l.top) t[tok] = lp;
    tops.push_back(t);
    offsets.push_back(at);
    at += l.token.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json choice_json(const ChoiceResult& c, bool continues) {
  return json{{"index", c.index},
              {"text", c.text ? json(*c.text) : json(ids_text(c.tokens, continues))},
              {"token_ids", c.tokens},
              {"logprobs", c.logprobs ? completion_logprobs_json(*c.logprobs) : json(nullptr)},
              {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)},
              {"stop_reason", !c.stop_string.empty() ? json(c.stop_string)
                              : c.stop_token >= 0    ? json(c.stop_token)
                                                     : json(nullptr)}};
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
  return req::guarded<CompletionParams>([&] { return parse(body, lim); }, err);
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
  return safe_dump(j);
}

std::string chunk_json(const std::string& id, int64_t created, const std::string& model, const ChoiceResult& choice,
                       bool continues) {
  json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", json::array({choice_json(choice, continues)})}};
  return safe_dump(j);
}

std::string usage_chunk_json(const std::string& id, int64_t created, const std::string& model, const Usage& usage) {
  json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", json::array()}, {"usage", usage_json(usage)}};
  return safe_dump(j);
}

std::string models_json(const ApiLimits& lim, int64_t created) {
  json j = {{"object", "list"},
            {"data", json::array({json{{"id", lim.model},
                                       {"object", "model"},
                                       {"created", created},
                                       {"owned_by", "m3mono"},
                                       {"max_model_len", lim.max_model_len},
                                       {"vocab_size", lim.vocab_size}}})}};
  return safe_dump(j);
}

}  // namespace m3::serve
