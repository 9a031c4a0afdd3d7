// The thinking / answer split of chat output (serve/reasoning.h): fixed cases per thinking mode,
// markers split at every position across chunks, and random texts cut into random chunks, whose
// split must equal the split of the whole text by an independent reference written here.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/reasoning.h"
#include "common/random.h"

using namespace m3::serve;

namespace {

struct Split {
  std::string reasoning, content;
  bool reasoned = false;
};

// The whole text at once, the straightforward way (the reference).
Split reference(const std::string& text, ThinkingMode mode) {
  const std::string open = "<mm:think>", close = "</mm:think>";
  Split s;
  size_t at = 0;
  if (mode == ThinkingMode::Disabled) {
    s.content = text;
    return s;
  }
  if (mode == ThinkingMode::Adaptive) {
    const size_t p = text.find_first_not_of(" \t\r\n");
    if (p == std::string::npos || text.compare(p, open.size(), open) != 0) {
      s.content = text;
      return s;
    }
    at = p + open.size();
  }
  s.reasoned = true;
  const size_t c = text.find(close, at);
  if (c == std::string::npos) {
    s.reasoning = text.substr(at);
  } else {
    s.reasoning = text.substr(at, c - at);
    s.content = text.substr(c + close.size());
  }
  return s;
}

// The text pushed in the given chunks, then finished.
Split chunked(const std::vector<std::string>& chunks, ThinkingMode mode) {
  ReasoningSplit r(mode);
  Split s;
  for (const auto& c : chunks) {
    const auto o = r.push(c);
    s.reasoning += o.reasoning;
    s.content += o.content;
  }
  const auto o = r.finish();
  s.reasoning += o.reasoning;
  s.content += o.content;
  s.reasoned = r.reasoned();
  return s;
}

const char* name(ThinkingMode m) {
  return m == ThinkingMode::Enabled ? "enabled" : m == ThinkingMode::Disabled ? "disabled" : "adaptive";
}

}  // namespace

TEST(ReasoningSplit, ModesAndFixedCases) {
  struct Case {
    ThinkingMode mode;
    std::string text, reasoning, content;
    bool reasoned;
  };
  const std::vector<Case> cases = {
      {ThinkingMode::Enabled, "why</mm:think>answer", "why", "answer", true},
      {ThinkingMode::Enabled, "no end yet", "no end yet", "", true},
      {ThinkingMode::Enabled, "</mm:think>", "", "", true},
      {ThinkingMode::Enabled, "a</mm:think>b</mm:think>c", "a", "b</mm:think>c", true},
      {ThinkingMode::Adaptive, "<mm:think>why</mm:think>answer", "why", "answer", true},
      {ThinkingMode::Adaptive, " \n<mm:think>x</mm:think>\n\ny", "x", "\n\ny", true},
      {ThinkingMode::Adaptive, "plain answer <mm:think>not</mm:think>", "", "plain answer <mm:think>not</mm:think>", false},
      {ThinkingMode::Adaptive, "<mm:th", "", "<mm:th", false},
      {ThinkingMode::Adaptive, "  ", "", "  ", false},
      {ThinkingMode::Adaptive, "", "", "", false},
      {ThinkingMode::Disabled, "<mm:think>x</mm:think>y", "", "<mm:think>x</mm:think>y", false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(name(c.mode)) + ": " + c.text);
    const Split s = chunked({c.text}, c.mode);
    EXPECT_EQ(s.reasoning, c.reasoning);
    EXPECT_EQ(s.content, c.content);
    EXPECT_EQ(s.reasoned, c.reasoned);
    const Split r = reference(c.text, c.mode);
    EXPECT_EQ(r.reasoning, c.reasoning);
    EXPECT_EQ(r.content, c.content);
  }
  ThinkingMode m;
  EXPECT_TRUE(parse_thinking_mode("enabled", &m) && m == ThinkingMode::Enabled);
  EXPECT_TRUE(parse_thinking_mode("disabled", &m) && m == ThinkingMode::Disabled);
  EXPECT_TRUE(parse_thinking_mode("adaptive", &m) && m == ThinkingMode::Adaptive);
  EXPECT_FALSE(parse_thinking_mode("Enabled", &m));
  EXPECT_FALSE(parse_thinking_mode("", &m));
}

// A marker cut at every position: nothing of it leaks while it may still complete, and the part
// before it goes out at once.
TEST(ReasoningSplit, MarkersSplitAcrossChunksNeverLeak) {
  const std::string text = "<mm:think>think hard</mm:think>the answer";
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); ++b) {
      const std::vector<std::string> chunks = {text.substr(0, a), text.substr(a, b - a), text.substr(b)};
      const Split s = chunked(chunks, ThinkingMode::Adaptive);
      ASSERT_EQ(s.reasoning, "think hard") << a << " " << b;
      ASSERT_EQ(s.content, "the answer") << a << " " << b;
    }
  // held back, then released
  ReasoningSplit r(ThinkingMode::Enabled);
  auto o = r.push("abc</mm:th");
  EXPECT_EQ(o.reasoning, "abc");
  EXPECT_EQ(o.content, "");
  o = r.push("ink>def");
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.content, "def");
  ReasoningSplit a(ThinkingMode::Adaptive);
  o = a.push("\n<mm:");
  EXPECT_EQ(o.reasoning + o.content, "");  // may still open the reasoning
  o = a.push("x");
  EXPECT_EQ(o.content, "\n<mm:x");  // it cannot any more
}

// Random texts of markers, marker pieces, whitespace and words, cut into random chunks: the same
// split as the whole text's reference, in every mode.
TEST(ReasoningSplit, RandomChunksEqualTheWholeText) {
  const uint64_t seed = m3::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> parts = {"<mm:think>", "</mm:think>", "<mm:", "think>", "</mm", ":think>", "<",
                                          "/", " ", "\n", "word", "é", "😀", "mm", ">"};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    std::vector<std::string> chunks;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::min(text.size() - at, size_t(rng() % 6));
      chunks.push_back(text.substr(at, len));
      at += len;
    }
    for (ThinkingMode m : {ThinkingMode::Enabled, ThinkingMode::Disabled, ThinkingMode::Adaptive}) {
      const Split want = reference(text, m), got = chunked(chunks, m);
      ASSERT_EQ(got.reasoning, want.reasoning) << name(m) << ": " << text;
      ASSERT_EQ(got.content, want.content) << name(m) << ": " << text;
      ASSERT_EQ(got.reasoned, want.reasoned) << name(m) << ": " << text;
    }
  }
}
