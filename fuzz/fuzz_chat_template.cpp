// libFuzzer target: the chat-template engine on an arbitrary template source, compiled and rendered
// over a fixed context (a system / user / assistant conversation with a tool call, tools,
// add_generation_prompt, bos/eos tokens, thinking_mode). Contract: compile and render either succeed
// or throw tmpl::TemplateError, under limits small enough that every hostile template ends quickly
// (steps, output, call depth, nesting); nothing else may escape, and a render frees everything it
// made (the live scope / namespace / callable counts return to where they were: reference cycles
// are caught here even with LeakSanitizer off). Any broken rule is a __builtin_trap.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "text/template_chat.h"

namespace {

using nlohmann::ordered_json;
namespace tmpl = m3::text::tmpl;

const ordered_json& context() {
  static const ordered_json c = ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris? ünïcödé 🌧"},
      {"role": "assistant", "content": "", "reasoning_content": "look it up",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
      {"role": "tool", "name": "get_weather", "content": "{\"temp\": 11.5}"},
      {"role": "assistant", "content": "11.5 C and rain."},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                              "required": ["city"]}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "thinking_mode": "enabled"
  })");
  return c;
}

const m3::text::ChatTemplateOptions& options() {
  static const m3::text::ChatTemplateOptions o = [] {
    m3::text::ChatTemplateOptions x;
    x.limits.max_steps = 200'000;
    x.limits.max_output_bytes = size_t{1} << 20;
    return x;
  }();
  return o;
}

bool same(const tmpl::LiveObjects& a, const tmpl::LiveObjects& b) {
  return a.scopes == b.scopes && a.namespaces == b.namespaces && a.callables == b.callables;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  const ordered_json& ctx = context();
  const tmpl::LiveObjects before = tmpl::live_objects();
  try {
    const auto t = m3::text::ChatTemplate::compile(source, options());
    try {
      const std::string out = t.render(ctx);
      if (out.size() > options().limits.max_output_bytes) __builtin_trap();
    } catch (const tmpl::TemplateError& e) {
      if (e.what()[0] == '\0') __builtin_trap();
    }
  } catch (const tmpl::TemplateError&) {
  } catch (...) {
    __builtin_trap();  // only TemplateError may escape
  }
  if (!same(tmpl::live_objects(), before)) __builtin_trap();  // the render leaked (a reference cycle)
  return 0;
}
