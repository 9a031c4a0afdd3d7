// MiniMax-M3 tool-call XML to OpenAI tool_calls (serve/tool_calls.h): arguments typed by the tools'
// JSON schemas (and by structure without one), several calls in a block, text around it, bad
// markup kept as text, and any cut of the text into chunks giving what the whole text gives.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/random.h"
#include "serve/tool_calls.h"

using namespace m3::serve;
using nlohmann::json;

namespace {

const std::string NS(kToolNs);

std::string el(const std::string& tag, const std::string& inner) { return NS + "<" + tag + ">" + inner + NS + "</" + tag + ">"; }
std::string invoke(const std::string& name, const std::string& args) {
  return NS + "<invoke name=\"" + name + "\">" + args + NS + "</invoke>";
}
std::string block(const std::vector<std::string>& invokes) {
  std::string s = NS + "<tool_call>\n";
  for (const auto& i : invokes) s += i + "\n";
  return s + NS + "</tool_call>";
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "ratio": {"type": "number"}, "note": {"type": ["string", "null"]},
      "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {"type": "array", "items": {"type": "integer"}}}},
      "hours": {"type": "array", "items": {"type": "integer"}},
      "raw": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "ping"}}
])");

struct Result {
  std::string content;
  std::vector<ToolCall> calls;
};
Result run(const std::vector<std::string>& chunks) {
  ToolCallParser p(kTools);
  Result r;
  auto add = [&](ToolCallParser::Out o) {
    r.content += o.content;
    for (auto& c : o.calls) r.calls.push_back(std::move(c));
  };
  for (const auto& c : chunks) add(p.push(c));
  add(p.finish());
  return r;
}

}  // namespace

TEST(ToolCalls, ArgumentsTypedBySchema) {
  const std::string text =
      "Let me check." + block({invoke("get_weather",
                                      el("city", "Paris 😀") + el("days", " 3 ") + el("metric", "false") + el("ratio", "0.25") +
                                          el("note", "null") + el("where", el("lat", "48.86") + el("tags", el("item", "1") + el("item", "2"))) +
                                          el("hours", el("item", "7") + el("item", "19")) + el("raw", "{\"a\": [1]}")),
                               invoke("ping", el("n", "5") + el("obj", el("k", "v")) + el("list", el("item", "x") + el("item", "y")))}) +
      "\nDone.";
  const Result r = run({text});
  EXPECT_EQ(r.content, "Let me check.\nDone.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments),
            json::parse(R"({"city": "Paris 😀", "days": 3, "metric": false, "ratio": 0.25, "note": null,
                            "where": {"lat": 48.86, "tags": [1, 2]}, "hours": [7, 19], "raw": {"a": [1]}})"));
  // no schema: text stays text, elements make objects and <item> lists arrays
  EXPECT_EQ(r.calls[1].name, "ping");
  EXPECT_EQ(json::parse(r.calls[1].arguments), json::parse(R"({"n": "5", "obj": {"k": "v"}, "list": ["x", "y"]})"));
  // a value that is not of its type stays the string the model wrote
  const Result b = run({block({invoke("get_weather", el("days", "three") + el("metric", "yes"))})});
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(json::parse(b.calls[0].arguments), json::parse(R"({"days": "three", "metric": "yes"})"));
  // a function the request did not list: still a call, untyped
  const Result u = run({block({invoke("other", el("x", "1"))})});
  ASSERT_EQ(u.calls.size(), 1u);
  EXPECT_EQ(json::parse(u.calls[0].arguments), json::parse(R"({"x": "1"})"));
}

TEST(ToolCalls, BadMarkupIsText) {
  // an invoke that does not parse is text, the good one beside it a call
  const std::string bad = NS + "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS + "</town>" + NS + "</invoke>";
  Result r = run({"a" + block({bad, invoke("ping", "")}) + "b"});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "ping");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_NE(r.content.find(bad), std::string::npos) << r.content;
  // a block still open at the end: the text as written
  const std::string open = NS + "<tool_call>\n" + NS + "<invoke name=\"ping\">" + NS + "<x>1";
  r = run({"hi " + open});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "hi " + open);
  // text that only looks like the start of a block
  r = run({"x ]<]mini", "max not a call ]<]"});
  EXPECT_EQ(r.content, "x ]<]minimax not a call ]<]");
  // a name with a quote, an empty name, a missing head: text
  for (const std::string& inv : {NS + "<invoke name=\"a\"b\">" + NS + "</invoke>", NS + "<invoke name=\"\">" + NS + "</invoke>",
                                 std::string("plain") + NS + "</invoke>"}) {
    r = run({block({inv})});
    EXPECT_TRUE(r.calls.empty()) << inv;
    EXPECT_NE(r.content.find(inv), std::string::npos) << inv;
  }
}

TEST(ToolCalls, ChunksGiveWhatTheWholeTextGives) {
  const uint64_t seed = m3::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> pieces = {
      "text ", "é😀", "\n", block({invoke("get_weather", el("city", "Rome") + el("days", "2"))}),
      block({invoke("ping", el("a", el("item", "1"))), invoke("get_weather", el("hours", el("item", "3")))}),
      NS, NS + "<tool_call>", "]<]", NS + "</invoke>", "<invoke name=\"ping\">"};
  for (int trial = 0; trial < 1500; ++trial) {
    std::string text;
    for (int i = int(rng() % 7); i > 0; --i) text += pieces[rng() % pieces.size()];
    const Result whole = run({text});
    std::vector<std::string> chunks;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::min(text.size() - at, size_t(1 + rng() % 9));
      chunks.push_back(text.substr(at, len));
      at += len;
    }
    const Result cut = run(chunks);
    ASSERT_EQ(cut.content, whole.content) << text;
    ASSERT_EQ(cut.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < cut.calls.size(); ++k) {
      ASSERT_EQ(cut.calls[k].name, whole.calls[k].name);
      ASSERT_EQ(cut.calls[k].arguments, whole.calls[k].arguments);
    }
    // no namespace marker of a parsed block reaches the content
    if (text.find(NS + "<tool_call>") == std::string::npos) ASSERT_EQ(whole.content, text);
  }
}
