// vLLM's POST /tokenize and POST /detokenize, without HTTP:
//   /tokenize    {"prompt": str, "add_special_tokens": bool = true, "model"?: str}, or
//                {"messages": [...], "add_generation_prompt": bool = true, "tools"?, "chat_template_kwargs"?,
//                 "add_special_tokens": bool = false} (rendered with the chat template first)
//                -> {"tokens": [...], "count": n, "max_model_len": m, "token_strs": null}
//   /detokenize  {"tokens": [int, ...], "model"?: str} -> {"prompt": str}
// Both need the checkpoint's tokenizer (without one: 400 "no_tokenizer"); every bad input is a
// 4xx ApiError naming the field (wrong types, invalid UTF-8, ids outside the vocabulary).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/completion_api.h"
#include "text/template_chat.h"

namespace m3::serve {

std::optional<std::vector<int32_t>> parse_tokenize_request(std::string_view body, const ApiLimits& lim,
                                                           const text::ChatTemplate* tmpl, ApiError& err);
std::string tokenize_json(const std::vector<int32_t>& tokens, int max_model_len);

// Returns the decoded text (special tokens kept, as tokenizers' decode does by default).
std::optional<std::string> parse_detokenize_request(std::string_view body, const ApiLimits& lim, ApiError& err);
std::string detokenize_json(const std::string& text);

}  // namespace m3::serve
