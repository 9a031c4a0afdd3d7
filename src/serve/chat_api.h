// The OpenAI /v1/chat/completions contract on top of /v1/completions, without HTTP: the messages
// (and tools, chat_template_kwargs, add_generation_prompt) are rendered with the checkpoint's chat
// template and encoded without special tokens (as transformers' apply_chat_template does); the
// sampling fields are validated exactly as /v1/completions validates them (max_completion_tokens
// is max_tokens). Responses are chat.completion objects (choices[i].message.content, and
// .reasoning_content: the thinking split off by chat_template_kwargs.thinking_mode, serve/reasoning.h,
// or null; .tool_calls: the calls of M3's tool-call XML when the request has tools and
// tool_choice is not "none", serve/tool_calls.h, finish_reason then "tool_calls") and
// chat.completion.chunk stream chunks (choices[0].delta.role first, then delta.reasoning_content,
// delta.content and delta.tool_calls with their index).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "serve/completion_api.h"
#include "text/template_chat.h"

namespace m3::serve {

// The prompt ids of a request body holding 'messages' (and optionally tools, chat_template_kwargs,
// add_generation_prompt = true, add_special_tokens = false); throws req::BadRequest naming the
// field. `route` names the endpoint in the error for a missing tokenizer or template.
std::vector<int32_t> render_chat_prompt(const nlohmann::json& body, const ApiLimits& lim,
                                        const text::ChatTemplate* tmpl, const char* route);

std::optional<CompletionParams> parse_chat_request(std::string_view body, const ApiLimits& lim,
                                                   const text::ChatTemplate* tmpl, ApiError& err);

std::string chat_completion_json(const std::string& id, int64_t created, const std::string& model,
                                 const std::vector<ChoiceResult>& choices, const Usage& usage);
// `first`: the choice's first chunk (carries delta.role).
std::string chat_chunk_json(const std::string& id, int64_t created, const std::string& model, const ChoiceResult& choice,
                            bool first);
std::string chat_usage_chunk_json(const std::string& id, int64_t created, const std::string& model, const Usage& usage);

}  // namespace m3::serve
