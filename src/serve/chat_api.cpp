// /v1/chat/completions: messages -> chat template -> token ids -> a /v1/completions request.
#include "serve/chat_api.h"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "serve/request_json.h"
#include "text/tokenizer.h"

namespace m3::serve {

using nlohmann::json;
using nlohmann::ordered_json;
using req::bad;
using req::field;
using req::type_name;

namespace {

const char* const kRoles[] = {"system", "developer", "user", "assistant", "ai", "tool"};

void check_messages(const json& msgs) {
  if (!msgs.is_array()) bad("messages", fmt::format("'messages' must be a list of messages, got {}", type_name(msgs)));
  if (msgs.empty()) bad("messages", "'messages' is empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad("messages", fmt::format("'{}' must be an object, got {}", at, type_name(m)));
    const json* role = field(m, "role");
    if (!role) bad("messages", fmt::format("'{}.role' is required", at));
    if (!role->is_string()) bad("messages", fmt::format("'{}.role' must be a string, got {}", at, type_name(*role)));
    const std::string& r = role->get_ref<const std::string&>();
    if (std::find(std::begin(kRoles), std::end(kRoles), r) == std::end(kRoles))
      bad("messages", fmt::format("'{}.role' = '{}' is not a known role (system, developer, user, assistant, tool)", at, r));
    const json* content = field(m, "content");
    if (!content) {
      if (r != "assistant" && r != "ai") bad("messages", fmt::format("'{}.content' is required", at));
      continue;
    }
    if (content->is_string()) continue;
    if (!content->is_array())
      bad("messages", fmt::format("'{}.content' must be a string or a list of content parts, got {}", at,
                                  type_name(*content)));
    for (size_t k = 0; k < content->size(); ++k) {
      const json& part = (*content)[k];
      const std::string pat = fmt::format("{}.content[{}]", at, k);
      if (!part.is_object()) bad("messages", fmt::format("'{}' must be an object, got {}", pat, type_name(part)));
      const json* type = field(part, "type");
      if (!type || !type->is_string() || type->get<std::string>() != "text")
        bad("messages", fmt::format("'{}.type' must be \"text\" (only text parts are supported)", pat));
      const json* text = field(part, "text");
      if (!text || !text->is_string()) bad("messages", fmt::format("'{}.text' must be a string", pat));
    }
  }
}

}  // namespace

std::vector<int32_t> render_chat_prompt(const json& j, const ApiLimits& lim, const text::ChatTemplate* tmpl,
                                        const char* route) {
  if (!lim.tokenizer || !tmpl)
    bad("", fmt::format("{} with 'messages' needs the checkpoint's tokenizer.json and chat template, and this model "
                        "directory lacks {}",
                        route, !lim.tokenizer ? "tokenizer.json" : "a chat template (chat_template.jinja)"),
        "no_chat_template");
  const json* msgs = field(j, "messages");
  if (!msgs) bad("messages", "'messages' is required");
  check_messages(*msgs);

  ordered_json ctx = ordered_json::object();
  ctx["messages"] = ordered_json::parse(msgs->dump());
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) bad("tools", fmt::format("'tools' must be a list, got {}", type_name(*tools)));
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      if (!t.is_object()) bad("tools", fmt::format("'tools[{}]' must be an object", i));
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object()) bad("tools", fmt::format("'tools[{}].function' must be an object", i));
      const json* name = field(*fn, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty())
        bad("tools", fmt::format("'tools[{}].function.name' must be a non-empty string", i));
      if (const json* ps = field(*fn, "parameters"); ps && !ps->is_object())
        bad("tools", fmt::format("'tools[{}].function.parameters' must be a JSON schema object, got {}", i,
                                 type_name(*ps)));
    }
    if (!tools->empty()) ctx["tools"] = ordered_json::parse(tools->dump());
  }
  bool gen = true;
  if (const json* v = field(j, "add_generation_prompt")) gen = req::as_bool(*v, "add_generation_prompt");
  ctx["add_generation_prompt"] = gen;
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object())
      bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' must be an object, got {}", type_name(*kw)));
    for (auto it = kw->begin(); it != kw->end(); ++it) {
      if (ctx.contains(it.key()))
        bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' must not set '{}'", it.key()));
      ctx[it.key()] = ordered_json::parse(it.value().dump());
    }
  }
  std::string rendered;
  try {
    rendered = tmpl->render(ctx);
  } catch (const std::exception& e) {
    bad("messages", fmt::format("the chat template rejected the request: {}", e.what()), "chat_template_error");
  }
  bool add_special = false;  // apply_chat_template's default: the template writes the markers
  if (const json* v = field(j, "add_special_tokens")) add_special = req::as_bool(*v, "add_special_tokens");
  return lim.tokenizer->encode(rendered, add_special);
}

namespace {

CompletionParams parse_chat(std::string_view body, const ApiLimits& lim, const text::ChatTemplate* tmpl) {
  json j = req::parse_body(body, lim);
  std::vector<int32_t> ids = render_chat_prompt(j, lim, tmpl, "/v1/chat/completions");

  // the rest is a /v1/completions request over the rendered prompt's ids
  json c = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "messages" || k == "tools" || k == "tool_choice" || k == "chat_template_kwargs" ||
        k == "add_generation_prompt" || k == "max_completion_tokens" || k == "add_special_tokens" || k == "logprobs" ||
        k == "top_logprobs" || k == "parallel_tool_calls")
      continue;
    c[k] = it.value();
  }
  if (const json* v = field(j, "max_completion_tokens")) {
    if (field(j, "max_tokens")) bad("max_completion_tokens", "give 'max_tokens' or 'max_completion_tokens', not both");
    c["max_tokens"] = *v;
  }
  int logprobs = -1;
  if (const json* v = field(j, "logprobs"); v && !v->is_null() && req::as_bool(*v, "logprobs")) logprobs = 0;
  if (const json* v = field(j, "top_logprobs"); v && !v->is_null()) {
    const int64_t k = req::as_int(*v, "top_logprobs");
    if (logprobs < 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (k < 0 || k > kMaxLogprobs)
      bad("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxLogprobs, k));
    logprobs = int(k);
  }
  bool parse_tools = true;
  if (const json* v = field(j, "tool_choice")) {
    if (!(v->is_string() && (v->get<std::string>() == "none" || v->get<std::string>() == "auto")))
      bad("tool_choice", "only 'tool_choice' \"auto\" and \"none\" are accepted");
    parse_tools = v->get<std::string>() == "auto";
  }
  ThinkingMode thinking = ThinkingMode::Adaptive;
  if (const json* kw = field(j, "chat_template_kwargs"))
    if (const json* m = field(*kw, "thinking_mode"))
      if (!m->is_string() || !parse_thinking_mode(m->get<std::string>(), &thinking))
        bad("chat_template_kwargs", "'chat_template_kwargs.thinking_mode' must be \"enabled\", \"disabled\" or \"adaptive\"");
  c["prompt"] = ids;
  ApiError e;
  std::optional<CompletionParams> p = parse_completion_request(c.dump(), lim, e);
  if (!p) {
    if (e.param == "prompt") e.param = "messages";
    throw req::BadRequest{e};
  }
  p->logprobs = logprobs;
  if (p->text_output) {
    p->thinking = thinking;
    if (const json* tools = field(j, "tools"); tools && !tools->empty() && parse_tools) p->tools = *tools;
  }
  return *p;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}
// OpenAI tool_calls; in stream chunks each carries its index in the choice.
json tool_calls_json(const std::vector<ToolCall>& calls, int first, bool indexed) {
  json a = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json c = {{"id", calls[k].id},
              {"type", "function"},
              {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (indexed) c["index"] = first + int(k);
    a.push_back(std::move(c));
  }
  return a;
}
// The chat API's logprobs object: content = [{token, logprob, bytes, top_logprobs: [...]}].
json chat_logprobs_json(const std::vector<LogprobText>& lps) {
  auto entry = [](const std::string& tok, float lp) {
    json bytes = json::array();
    for (unsigned char b : tok) bytes.push_back(int(b));
    return json{{"token", tok}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& l : lps) {
    json e = entry(l.token, l.logprob);
    json top = json::array();
    for (const auto& [tok, lp] : l.top) top.push_back(entry(tok, lp));
    e["top_logprobs"] = top;
    content.push_back(std::move(e));
  }
  return json{{"content", content}};
}
json finish_json(const ChoiceResult& c) { return c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason); }
json stop_reason_json(const ChoiceResult& c) {
  return !c.stop_string.empty() ? json(c.stop_string) : c.stop_token >= 0 ? json(c.stop_token) : json(nullptr);
}

}  // namespace

std::optional<CompletionParams> parse_chat_request(std::string_view body, const ApiLimits& lim,
                                                   const text::ChatTemplate* tmpl, ApiError& err) {
  return req::guarded<CompletionParams>([&] { return parse_chat(body, lim, tmpl); }, err);
}

std::string chat_completion_json(const std::string& id, int64_t created, const std::string& model,
                                 const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json cs = json::array();
  for (const auto& c : choices) {
    json msg = {{"role", "assistant"},
                {"content", c.tool_calls.empty() || !c.text.value_or("").empty() ? json(c.text.value_or("")) : json(nullptr)},
                {"reasoning_content", c.reasoning ? json(*c.reasoning) : json(nullptr)}};
    if (!c.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(c.tool_calls, 0, false);
    cs.push_back({{"index", c.index},
                  {"message", msg},
                  {"logprobs", c.logprobs ? chat_logprobs_json(*c.logprobs) : json(nullptr)},
                  {"finish_reason", finish_json(c)},
                  {"stop_reason", stop_reason_json(c)},
                  {"token_ids", c.tokens}});
  }
  return json{{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
              {"choices", cs}, {"usage", usage_json(usage)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chat_chunk_json(const std::string& id, int64_t created, const std::string& model, const ChoiceResult& c,
                            bool first) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  const bool reasoning = c.reasoning && !c.reasoning->empty();
  if (reasoning) delta["reasoning_content"] = *c.reasoning;
  if ((!reasoning && c.tool_calls.empty()) || (c.text && !c.text->empty())) delta["content"] = c.text.value_or("");
  if (!c.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(c.tool_calls, c.tool_call_index, true);
  json ch = {{"index", c.index}, {"delta", delta},
             {"logprobs", c.logprobs ? chat_logprobs_json(*c.logprobs) : json(nullptr)}, {"finish_reason", finish_json(c)},
             {"token_ids", c.tokens}};
  if (!c.finish_reason.empty()) ch["stop_reason"] = stop_reason_json(c);
  return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
              {"choices", json::array({ch})}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chat_usage_chunk_json(const std::string& id, int64_t created, const std::string& model, const Usage& usage) {
  return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
              {"choices", json::array()}, {"usage", usage_json(usage)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace m3::serve
