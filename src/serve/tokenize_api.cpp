// /tokenize and /detokenize request parsing and response JSON.
#include "serve/tokenize_api.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "serve/chat_api.h"
#include "serve/request_json.h"
#include "text/tokenizer.h"

namespace m3::serve {

using nlohmann::json;
using req::bad;
using req::field;
using req::type_name;

namespace {

// The body, with the tokenizer present and 'model' (optional here, as in vLLM) naming this server.
json checked_body(std::string_view body, const ApiLimits& lim, const char* route) {
  json j = req::parse_body(body, lim);
  if (!lim.tokenizer)
    bad("", fmt::format("{} needs a tokenizer, and this checkpoint has none (no tokenizer.json in the model directory)",
                        route),
        "no_tokenizer");
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*m)));
    if (m->get<std::string>() != lim.model)
      bad("model", fmt::format("the model '{}' does not exist; this server serves '{}'", m->get<std::string>(), lim.model),
          "model_not_found", 404);
  }
  return j;
}

}  // namespace

std::optional<std::vector<int32_t>> parse_tokenize_request(std::string_view body, const ApiLimits& lim,
                                                           const text::ChatTemplate* tmpl, ApiError& err) {
  return req::guarded<std::vector<int32_t>>(
      [&] {
        json j = checked_body(body, lim, "/tokenize");
        if (field(j, "messages")) {
          if (field(j, "prompt")) bad("prompt", "give 'prompt' or 'messages', not both");
          return render_chat_prompt(j, lim, tmpl, "/tokenize");
        }
        const json* p = field(j, "prompt");
        if (!p) bad("prompt", "'prompt' (a string) or 'messages' (a chat) is required");
        if (!p->is_string()) bad("prompt", fmt::format("'prompt' must be a string, got {}", type_name(*p)));
        bool add_special = true;
        if (const json* v = field(j, "add_special_tokens")) add_special = req::as_bool(*v, "add_special_tokens");
        return lim.tokenizer->encode(p->get_ref<const std::string&>(), add_special);
      },
      err);
}

std::string tokenize_json(const std::vector<int32_t>& tokens, int max_model_len) {
  return json{{"count", tokens.size()}, {"max_model_len", max_model_len}, {"tokens", tokens}, {"token_strs", nullptr}}
      .dump();
}

std::optional<std::string> parse_detokenize_request(std::string_view body, const ApiLimits& lim, ApiError& err) {
  return req::guarded<std::string>(
      [&] {
        json j = checked_body(body, lim, "/detokenize");
        const json* t = field(j, "tokens");
        if (!t) bad("tokens", "'tokens' is required");
        if (!t->is_array()) bad("tokens", fmt::format("'tokens' must be a list of token ids, got {}", type_name(*t)));
        std::vector<int32_t> ids;
        ids.reserve(t->size());
        for (size_t i = 0; i < t->size(); ++i) {
          const json& v = (*t)[i];
          if (!v.is_number_integer())
            bad("tokens", fmt::format("'tokens[{}]' must be an integer token id, got {}", i, type_name(v)));
          const bool outside = v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(lim.vocab_size)
                                                      : v.get<int64_t>() < 0 || v.get<int64_t>() >= lim.vocab_size;
          if (outside)
            bad("tokens", fmt::format("'tokens[{}]' = {} is outside the vocabulary [0, {})", i, v.dump(), lim.vocab_size),
                "invalid_token_id");
          ids.push_back(int32_t(v.get<int64_t>()));
        }
        return lim.tokenizer->decode(ids, false);
      },
      err);
}

std::string detokenize_json(const std::string& text) { return json{{"prompt", text}}.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace m3::serve
