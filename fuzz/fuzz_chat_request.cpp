// libFuzzer target: the bodies of /v1/chat/completions, /tokenize and /detokenize (the first byte
// picks one; the rest is the body, any bytes) through the server's own parsers, with make-tiny's
// tokenizer and chat template (no engine, no HTTP). Contract:
//  - nothing escapes;
//  - chat: one prompt of ids in the vocabulary within the prompt and context caps, a thinking mode,
//    tools either none or the request's list; or a 4xx error;
//  - tokenize: ids in the vocabulary and a response that parses back to them; detokenize: a
//    response that parses (the text is a JSON string, whatever bytes the ids decode to);
//  - an error has a 4xx status and a message, and the server's error body parses back to it.
// Any broken rule is a __builtin_trap (a crash libFuzzer keeps).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/chat_api.h"
#include "serve/tokenize_api.h"
#include "text/template_chat.h"
#include "text/tiny_chat_template.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"

namespace {

using m3::serve::ApiError;
using m3::serve::ApiLimits;
using nlohmann::json;

constexpr int kVocab = 1024;

struct Setup {
  std::unique_ptr<m3::text::Tokenizer> tok;
  std::unique_ptr<m3::text::ChatTemplate> tmpl;
  ApiLimits limits;
};
const Setup& setup() {
  static const Setup s = [] {
    Setup x;
    x.tok = std::make_unique<m3::text::Tokenizer>(
        m3::text::Tokenizer::from_json_text(m3::text::tiny_tokenizer_json(kVocab, 1, 2), kVocab));
    x.tmpl = std::make_unique<m3::text::ChatTemplate>(m3::text::ChatTemplate::compile(m3::text::tiny_chat_template()));
    x.limits.model = "tiny";
    x.limits.vocab_size = kVocab;
    x.limits.max_model_len = 512;
    x.limits.max_prompt_tokens = 480;
    x.limits.max_completion_tokens = 32;
    x.limits.max_prompts = 4;
    x.limits.max_body_bytes = 6000;
    x.limits.max_json_depth = 8;
    x.limits.tokenizer = x.tok.get();
    return x;
  }();
  return s;
}

void require(bool ok) {
  if (!ok) __builtin_trap();
}

bool in_vocab(const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= kVocab) return false;
  return true;
}

void check_error(const ApiError& e) {
  require(e.status >= 400 && e.status < 500 && !e.message.empty() && !e.type.empty());
  const json j = json::parse(m3::serve::error_json(e));
  require(j["error"]["message"] == e.message && j["error"]["type"] == e.type);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Setup& s = setup();
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  ApiError err;
  try {
    switch (data[0] % 3) {
      case 0: {
        const auto p = m3::serve::parse_chat_request(body, s.limits, s.tmpl.get(), err);
        if (!p) return check_error(err), 0;
        require(p->prompts.size() == 1 && !p->prompts[0].empty() && in_vocab(p->prompts[0]));
        require(p->prompts[0].size() <= size_t(s.limits.max_prompt_tokens));
        require(int64_t(p->prompts[0].size()) + p->max_tokens <= s.limits.max_model_len);
        require(p->text_output && p->thinking.has_value());
        require(p->tools.is_null() || (p->tools.is_array() && !p->tools.empty()));
        break;
      }
      case 1: {
        const auto ids = m3::serve::parse_tokenize_request(body, s.limits, s.tmpl.get(), err);
        if (!ids) return check_error(err), 0;
        require(in_vocab(*ids));
        const json j = json::parse(m3::serve::tokenize_json(*ids, s.limits.max_model_len));
        require(j["tokens"] == json(*ids) && j["count"] == ids->size());
        break;
      }
      default: {
        const auto text = m3::serve::parse_detokenize_request(body, s.limits, err);
        if (!text) return check_error(err), 0;
        const json j = json::parse(m3::serve::detokenize_json(*text));
        require(j["prompt"].is_string());
        break;
      }
    }
  } catch (...) {
    __builtin_trap();  // nothing may escape
  }
  return 0;
}
