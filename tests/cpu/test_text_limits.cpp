// The text library on untrusted input: a render frees everything it made (macros refer to their
// scope without owning it; namespaces that hold themselves are emptied at the end), hostile
// templates end in an error naming the limit they hit (macro recursion, nesting, values nested
// without bound or holding themselves) rather than overflowing the stack, and the pre-tokenizer's
// PCRE2 searches stop at their match / depth / heap limits with an error naming the limit.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "text/regex.h"
#include "text/template_chat.h"
#include "text/template_parser.h"
#include "text/template_render.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"

namespace {

using m3::text::ChatTemplate;
using m3::text::ChatTemplateOptions;
using m3::text::Regex;
using m3::text::RegexLimits;
using m3::text::tmpl::live_objects;
using m3::text::tmpl::LiveObjects;
using m3::text::tmpl::TemplateError;
using nlohmann::ordered_json;
namespace tmpl = m3::text::tmpl;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string live_str(const LiveObjects& o) {
  return std::to_string(o.scopes) + " scopes, " + std::to_string(o.namespaces) + " namespaces, " +
         std::to_string(o.callables) + " callables";
}

// Renders src (an error is fine: its message is returned) and checks that the objects alive
// afterwards are the ones alive before.
std::string render_and_check_freed(const std::string& src) {
  const LiveObjects before = live_objects();
  std::string out;
  {
    const ChatTemplate t = ChatTemplate::compile(src);
    try {
      out = t.render(ordered_json::object());
    } catch (const TemplateError& e) {
      out = std::string("error: ") + e.what();
    }
  }
  const LiveObjects after = live_objects();
  EXPECT_TRUE(after.scopes == before.scopes && after.namespaces == before.namespaces &&
              after.callables == before.callables)
      << "alive after rendering: " << live_str(after) << "; before: " << live_str(before) << "\ntemplate: " << src;
  return out;
}

TEST(TextLimits, RenderFreesMacroScopes) {
  // the bug: the macro's value held the scope it was defined in, which held the macro
  EXPECT_EQ(render_and_check_freed("{% macro m(x) %}{{ x }}{% endmacro %}{{ m(1) }}"), "1");
  // closures keep working for the whole render: over a macro's parameter, over a loop variable
  // after the loop ended (through a namespace), a call block's caller called after the call
  EXPECT_EQ(render_and_check_freed("{% macro outer(a) %}{% macro inner() %}{{ a }}{% endmacro %}{{ inner() }}"
                                   "{% endmacro %}{{ outer(5) }}{{ outer(6) }}"),
            "56");
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace() %}{% for i in [1, 2] %}{% macro m() %}<{{ i }}>"
                                   "{% endmacro %}{% set ns.f = m %}{% endfor %}{{ ns.f() }}"),
            "<2>");
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace() %}{% macro m() %}{% set ns.c = caller %}[{{ caller() }}]"
                                   "{% endmacro %}{% call m() %}x{% endcall %}{{ ns.c() }}"),
            "[x]x");
  EXPECT_EQ(render_and_check_freed("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                                   "{% set g = f %}{{ g(3) }}"),
            "321");
  // a render that fails half-way frees everything too
  EXPECT_TRUE(contains(render_and_check_freed("{% set ns = namespace() %}{% macro m() %}{% endmacro %}{% set ns.m = m %}"
                                              "{{ raise_exception('stop') }}"),
                       "stop"));
}

TEST(TextLimits, RenderFreesNamespacesThatHoldThemselves) {
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace() %}{% set ns.self = ns %}ok"), "ok");
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace() %}{% set ns.d = {'n': ns} %}{% set ns.l = [ns] %}ok"), "ok");
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace(l=[1]) %}{% set ns.l = [ns, ns.l.count] %}{{ ns.l[1](1) }}"),
            "1");
  EXPECT_EQ(render_and_check_freed("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ a.b.a is defined }}"),
            "True");
}

// A macro or call block inside a loop keeps no scope alive per iteration: the count of live scopes
// seen from inside the render stays small.
TEST(TextLimits, MacrosInLoopsDoNotPileUpScopes) {
  auto peak_scopes = [](const std::string& src) {
    int64_t peak = 0;
    tmpl::Value ctx = tmpl::Value::dict();
    ctx.dict_ptr()->set("probe", tmpl::Value::callable("probe", [&peak](tmpl::CallArgs&, tmpl::Renderer&) {
      peak = std::max(peak, live_objects().scopes);
      return tmpl::Value(std::string());
    }));
    auto program = tmpl::parse_template(src, {});
    const int64_t base = live_objects().scopes;
    tmpl::Renderer(*program, ctx, tmpl::RenderLimits{}).run();
    return peak - base;
  };
  EXPECT_LT(peak_scopes("{% for i in range(2000) %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{{ probe() }}{% endfor %}"), 10);
  EXPECT_LT(peak_scopes("{% macro w() %}{{ caller() }}{% endmacro %}"
                        "{% for i in range(2000) %}{% call w() %}{{ i }}{% endcall %}{{ probe() }}{% endfor %}"),
            10);
  // stored outside the loop each time: the scopes of the overwritten ones go by the next sweep
  EXPECT_LT(peak_scopes("{% set ns = namespace() %}{% for i in range(2000) %}{% macro m() %}{{ i }}{% endmacro %}"
                        "{% set ns.f = m %}{{ probe() }}{% endfor %}{{ ns.f() }}"),
            200);
}

std::string limit_error(const std::string& src) {
  try {
    ChatTemplate::compile(src).render(ordered_json::object());
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind(), TemplateError::Kind::Limit) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "rendered without an error: " << src;
  return "";
}

TEST(TextLimits, TemplateRecursionAndNestingAreBounded) {
  EXPECT_TRUE(contains(limit_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                       "macro calls nested deeper than 100"));
  // each call nests 60 expressions: over 100 calls that is more levels than the stack holds
  const std::string brackets = "{% macro f(n) %}{% if n < 99 %}{{ " + std::string(60, '[') + "f(n + 1)" +
                               std::string(60, ']') + " }}{% endif %}{% endmacro %}{{ f(0) }}";
  EXPECT_TRUE(contains(limit_error(brackets), "nested deeper than 1500 levels"));
  // the output cap names its size
  EXPECT_TRUE(contains(limit_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"), "exceeds 67108864 bytes"));
}

TEST(TextLimits, DeepAndSelfHoldingValues) {
  const std::string deep = "{% set ns = namespace(x=0) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  // freeing a value nested 100000 deep (and sharing) must not recurse that deep
  EXPECT_EQ(render_and_check_freed(deep + "done"), "done");
  EXPECT_EQ(render_and_check_freed("{% set ns = namespace(x={}) %}{% for i in range(50000) %}"
                                   "{% set ns.x = {'a': ns.x, 'b': namespace(y=ns.x)} %}{% endfor %}done"),
            "done");
  // printing or comparing it stops at the value nesting limit
  EXPECT_TRUE(contains(limit_error(deep + "{{ ns.x }}"), "printing of a value nested deeper than 512 levels"));
  EXPECT_TRUE(contains(limit_error(deep + "{{ ns.x == ns.x }}"), "comparing of a value nested deeper than 512"));
  EXPECT_TRUE(contains(limit_error(deep + "{{ [ns.x] < [ns.x] }}"), "nested deeper than 512"));
  // so does printing a namespace that holds itself
  EXPECT_TRUE(contains(limit_error("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}"), "holding itself"));
}

// (a+)+b backtracks exponentially on a run of a's followed by anything but b.
const char* const kCatastrophic = "(a+)+b";
const std::string kHostileText = std::string(40, 'a') + "cb";

std::string regex_error(const char* pattern, const std::string& text, const RegexLimits& limits) {
  try {
    Regex r(pattern, "test pattern", limits);
    std::vector<std::pair<size_t, size_t>> found;
    r.find_all(text, found);
  } catch (const m3::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error from " << pattern;
  return "";
}

TEST(TextLimits, RegexSearchesStopAtTheirLimits) {
  // the defaults, with the JIT and with the interpreter
  for (bool jit : {true, false}) {
    RegexLimits l;
    l.jit = jit;
    const std::string e = regex_error(kCatastrophic, kHostileText, l);
    EXPECT_TRUE(contains(e, "test pattern: regex '(a+)+b'") && contains(e, "from byte 0 of a 42-byte text") &&
                contains(e, "the match limit (10000000 backtracking steps) was exceeded"))
        << e;
  }
  // depth and heap: the interpreter's
  RegexLimits depth;
  depth.jit = false;
  depth.depth = 1000;
  EXPECT_TRUE(contains(regex_error("(a|b)*c", std::string(5000, 'a') + "c", depth),
                       "the depth limit (1000 nested backtracking points) was exceeded"));
  RegexLimits heap;
  heap.jit = false;
  heap.heap_kib = 64;
  EXPECT_TRUE(contains(regex_error("(a|b)*c", std::string(100000, 'a') + "c", heap),
                       "the heap limit (64 KiB of backtracking memory) was exceeded"));
  // within the default limits the same pattern and text match
  Regex ok("(a|b)*c", "test pattern");
  std::vector<std::pair<size_t, size_t>> found;
  ok.find_all(std::string(100000, 'a') + "c", found);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].second, 100001u);
}

TEST(TextLimits, TokenizerNamesThePatternThatHitALimit) {
  // the tiny tokenizer with its split pattern replaced by a catastrophic one
  nlohmann::json j = nlohmann::json::parse(m3::text::tiny_tokenizer_json(1024, 1, 2));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kCatastrophic;
  const auto tok = m3::text::Tokenizer::from_json_text(j.dump(), 1024);
  try {
    tok.encode(kHostileText, false);
    ADD_FAILURE() << "encoded without an error";
  } catch (const m3::Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "pre_tokenizer.pretokenizers[0].pattern.Regex") && contains(msg, "match limit")) << msg;
  }
  // M3's own pattern on long hostile-looking runs stays far inside the limits
  const auto m3tok = m3::text::Tokenizer::from_json_text(m3::text::tiny_tokenizer_json(1024, 1, 2), 1024);
  for (const std::string& text : {std::string(200000, ' ') + "x", std::string(200000, 'a'), std::string(100000, '1'),
                                  std::string(50000, '\'') + "s", std::string(60000, '\n') + std::string(60000, '!')})
    EXPECT_NO_THROW(m3tok.encode(text, false)) << text.size() << " bytes";
}

}  // namespace
