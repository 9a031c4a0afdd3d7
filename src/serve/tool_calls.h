// MiniMax-M3's tool calls in its answer text, as OpenAI tool_calls. The model writes namespaced XML,
// every tag prefixed by NS = `]<]minimax[>[`:
//   NS<tool_call>
//   NS<invoke name="get_weather">NS<city>Paris NS</city>NS<days>3NS</days>NS</invoke>
//   NS<invoke name="...">...NS</invoke>
//   NS</tool_call>
// one element per argument, named after it; an object argument as child elements, an array as
// repeated NS<item> children; the values untyped text. Types come from the request's tool JSON
// schemas (`parameters`): string, integer, number, boolean, null, object, array (a value that does
// not parse as its type stays a string; an argument without a schema is a string, or an object /
// array by its elements). Whitespace between elements is ignored; string values are kept as written.
// Streaming: text before a call block is content, text that may still begin a block is held back,
// a call is released once its NS</invoke> is complete (arguments whole, as vLLM emits them), and
// the text after the block is content again. An invoke that does not parse, and a block still open
// when the text ends, come out as content, raw: bad model output is text, never an error.
#pragma once
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace m3::serve {

inline constexpr std::string_view kToolNs = "]<]minimax[>[";

struct ToolCall {
  std::string id;         // set by the server ("call_" + 16 hex digits)
  std::string name;
  std::string arguments;  // a JSON object, as text
};

class ToolCallParser {
 public:
  // tools: the request's `tools` (OpenAI: [{"type": "function", "function": {"name", "parameters"}}]).
  explicit ToolCallParser(const nlohmann::json& tools);

  struct Out {
    std::string content;
    std::vector<ToolCall> calls;
  };
  // last: the text ends with this piece (what is held back, an open block included, comes out too)
  Out push(std::string_view text, bool last = false);
  Out finish() { return push({}, true); }

 private:
  Out release(bool final);

  std::map<std::string, nlohmann::json> schemas_;  // function name -> parameters schema
  std::string held_;
  bool in_block_ = false;
  int calls_in_block_ = 0;
};

// One invoke's text (from its NS<invoke name="..."> up to, not including, its NS</invoke>) as a
// call whose arguments are typed by the named function's schema in `schemas` (none: untyped);
// false when it does not parse.
bool parse_invoke(std::string_view text, const std::map<std::string, nlohmann::json>& schemas, ToolCall* out);

}  // namespace m3::serve
