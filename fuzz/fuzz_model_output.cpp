// libFuzzer target: model output, which is untrusted text too, through a chat answer's parsers as
// the server runs them: the thinking split (serve/reasoning.h; the mode from the first byte), then
// the tool-call parser (serve/tool_calls.h; a fixed tools list with typed parameters) on what the
// split leaves as content. The text (bytes from the third on, any bytes) goes in once whole and once
// in chunks cut where the second byte's seed says. Contract:
//  - nothing escapes;
//  - the chunked run gives exactly the reasoning, the content and the calls of the whole run (no
//    marker split across chunks changes anything);
//  - every call has a non-empty name and arguments that parse as a JSON object;
//  - text without any `]<]minimax[>[<tool_call>` comes out of the parser unchanged.
// Any broken rule is a __builtin_trap (a crash libFuzzer keeps).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace {

using m3::serve::ReasoningSplit;
using m3::serve::ThinkingMode;
using m3::serve::ToolCall;
using m3::serve::ToolCallParser;
using nlohmann::json;

const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
       "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
       "z": {"type": ["null", "integer"]}, "o": {"type": "object", "properties": {"a": {"type": "array",
       "items": {"type": "number"}}}}, "a": {"type": "array", "items": {"type": "object"}}}}}},
    {"type": "function", "function": {"name": "g"}}])");
  return t;
}

struct Result {
  std::string reasoning, content, parsed_from;  // parsed_from: the content before tool parsing
  std::vector<ToolCall> calls;
};

Result run(const std::string& text, ThinkingMode mode, const std::vector<size_t>& cuts) {
  ReasoningSplit split(mode);
  ToolCallParser parser(tools());
  Result r;
  auto take = [&](ReasoningSplit::Out s, bool last) {
    r.reasoning += s.reasoning;
    r.parsed_from += s.content;
    ToolCallParser::Out t = parser.push(s.content, last);
    r.content += t.content;
    for (auto& c : t.calls) r.calls.push_back(std::move(c));
  };
  size_t at = 0;
  for (size_t c : cuts) {
    take(split.push(std::string_view(text).substr(at, c - at)), false);
    at = c;
  }
  take(split.push(std::string_view(text).substr(at)), false);
  take(split.finish(), true);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const ThinkingMode mode = data[0] % 3 == 0 ? ThinkingMode::Enabled
                            : data[0] % 3 == 1 ? ThinkingMode::Disabled
                                               : ThinkingMode::Adaptive;
  uint32_t seed = data[1] * 2654435761u + 1;
  const std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<size_t> cuts;
  for (size_t at = 0;;) {
    seed = seed * 1664525u + 1013904223u;
    at += 1 + (seed >> 24) % 7;
    if (at >= text.size()) break;
    cuts.push_back(at);
  }
  try {
    const Result whole = run(text, mode, {}), cut = run(text, mode, cuts);
    if (whole.reasoning != cut.reasoning || whole.content != cut.content || whole.calls.size() != cut.calls.size())
      __builtin_trap();
    for (size_t k = 0; k < whole.calls.size(); ++k) {
      if (whole.calls[k].name != cut.calls[k].name || whole.calls[k].arguments != cut.calls[k].arguments)
        __builtin_trap();
      if (whole.calls[k].name.empty()) __builtin_trap();
      const json a = json::parse(whole.calls[k].arguments, nullptr, false);
      if (a.is_discarded() || !a.is_object()) __builtin_trap();
    }
    if (whole.parsed_from.find(std::string(m3::serve::kToolNs) + "<tool_call>") == std::string::npos &&
        (whole.content != whole.parsed_from || !whole.calls.empty()))
      __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  return 0;
}
