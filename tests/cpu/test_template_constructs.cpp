// Each construct of the chat-template engine, rendered by the engine and by Python jinja2
// (configured as transformers configures it) over one context: the outputs must be equal byte
// for byte, and where jinja2 raises, the engine must raise too.
#include <gtest/gtest.h>

#include "test_template_util.h"
#include "text/template_chat.h"

namespace {

using m3::text::ChatTemplate;
using nlohmann::ordered_json;

const char* kContext = R"JSON({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \"there\", it's me \\ {{ not a tag }}"},
    {"role": "assistant", "content": "  Hello!\n", "reasoning_content": "think\nhard",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
        "arguments": {"city": "Paris", "days": 3, "units": null, "flags": [true, false],
                      "nested": {"a": 1.5, "b": [1, "x"]}}}}]},
    {"role": "tool", "content": "{\"temp\": 20}"},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "image"}, {"type": "text", "text": "part two"}]}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather — forecast, «quoted»",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}}],
  "n": 5, "neg": -7, "f": 2.5, "big": 1e20, "small": 0.0001, "tiny": 1e-7,
  "s": "  Mixed Case éß 日本 x ", "empty": "", "lst": [3, 1, 2], "strs": ["b", "A", "c", "a"],
  "d": {"b": 2, "a": 1, "items": "x"}, "none": null, "t": true, "fl": false,
  "nested": [[1, 2], [3, 4]], "emoji": "a😀b", "ctrl": "tab\there\u0001\u007f", "num_str": "42", "float_str": " 4.5 "
})JSON";

// Templates covering statements, whitespace control, expressions, tests, filters and methods.
const std::vector<std::string> kCases = {
    // output and literals
    "{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.5 }}{{ -3 }}{{ true }}{{ True }}{{ none }}{{ None }}{{ [1, 'x', none] }}",
    "{{ {'k': 'v', 'n': [1, 2.0]} }}{{ (1, 2) }}{{ (1,) }}{{ () }}{{ [] }}{{ {} }}",
    "{{ 'esc: \\n \\t \\\\ \\' \\\" \\x41 \\u00e9 \\U0001F600 \\101 \\q' }}",
    "{{ 'adj' 'acent' }}{{ 1_000 }}{{ 0x1F }}{{ 0o17 }}{{ 0b101 }}{{ 1e3 }}{{ 2.5e-3 }}",
    "{{ big }} {{ small }} {{ tiny }} {{ 1/3 }} {{ 10/2 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 123456789012345.6 }} {{ -0.0 }}",
    "{{ s }}|{{ empty }}|{{ undefined_name }}|{{ d.missing }}|{{ none.attr }}|",
    "{{ ctrl }}{{ [ctrl, emoji, \"it's\", 'say \"hi\"', 'both \\' \"'] }}",
    // arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -n }} {{ +n }} {{ - - n }} {{ n - -1 }} {{ true + 1 }}",
    "{{ 'a' ~ 1 ~ none ~ undefined_name ~ 1.0 ~ [1] }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2, 3] }}",
    "{{ 'x' + 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ undefined_name + 1 }}",
    // comparisons and logic
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 1 <= 0 }}",
    "{{ 'ell' in 'hello' }} {{ 2 in lst }} {{ 'a' in d }} {{ 'z' not in d }} {{ 5 not in lst }} {{ 'x' in undefined_name }}",
    "{{ true and 'yes' }} {{ false or 'fallback' }} {{ none or 0 }} {{ not none }} {{ not 1 }} {{ 0 and 1 }} {{ '' or [] }}",
    "{{ 'a' if t else 'b' }} {{ 'a' if fl else 'b' }} [{{ 'a' if fl }}] {{ 1 if none else 2 if t else 3 }}",
    "{{ undefined_name == undefined_other }} {{ none == none }} {{ [1] == [1.0] }} {{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }}",
    "{{ 1 < 'a' }}",
    "{{ 1 in 'abc' }}",
    // attribute, subscript, slicing
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} {{ messages[2].tool_calls[0].function.name }}",
    "{{ d.items is defined }} {{ d.items is callable }} {{ d.nosuch is callable }}",
    "{{ d['items'] }} {{ d.b }} {{ d['zz'] }} {{ lst[5] }} {{ lst.0 }} {{ nested[1][0] }} {{ 'abc'[1] }} {{ emoji[1] }} {{ s[-2] }}",
    "{{ lst[1:] }} {{ lst[:-1] }} {{ lst[::-1] }} {{ lst[::2] }} {{ 'hello'[1:4] }} {{ 'hello'[::-1] }} {{ emoji[::-1] }} {{ lst[5:] }} {{ lst[-10:1] }} {{ 'abcdef'[-2:0:-2] }}",
    "{{ messages[1:][0].role }} {{ messages[:2]|length }}",
    "{{ undefined_name.attr }}",
    "{{ undefined_name['k'] }}",
    "{{ messages[10].role }}",
    // tests
    "{{ n is defined }} {{ x is defined }} {{ x is undefined }} {{ none is none }} {{ n is none }} {{ d.zz is defined }} {{ d.b is not defined }}",
    "{{ 'a' is string }} {{ 1 is string }} {{ d is mapping }} {{ lst is mapping }} {{ lst is iterable }} {{ 'x' is iterable }} {{ n is iterable }} {{ d is sequence }} {{ lst is sequence }} {{ 1 is sequence }}",
    "{{ 1 is number }} {{ 1.5 is number }} {{ t is number }} {{ 'a' is number }} {{ 1 is integer }} {{ t is integer }} {{ 1.0 is float }} {{ t is boolean }} {{ 1 is boolean }}",
    "{{ t is true }} {{ 1 is true }} {{ fl is false }} {{ 0 is false }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}",
    "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 1 is ne 2 }} {{ 2 is in lst }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 'aB' is lower }}",
    "{{ none is sameas none }} {{ t is sameas true }} {{ range is callable }} {{ 'a' is callable }} {{ messages[0].get is callable }}",
    // filters
    "[{{ s|trim }}] [{{ 'xxhixx'|trim('x') }}] [{{ s|length }}] [{{ lst|length }}] [{{ d|count }}] [{{ undefined_name|length }}] [{{ emoji|length }}]",
    "{{ lst|join(', ') }} {{ strs|join }} {{ 'abc'|join('-') }} {{ messages|map(attribute='role')|join('/') }} {{ d|join(',') }} {{ [1, none, 'x']|join('|') }}",
    "{{ undefined_name|default('dflt') }} {{ none|default('dflt') }} {{ none|default('dflt', true) }} {{ ''|d('e', boolean=true) }} {{ n|default(1) }}",
    "{{ lst|first }} {{ lst|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ d|first }} [{{ []|first }}] {{ undefined_name|first }}",
    "{{ s|upper }} {{ s|lower }} {{ 'hello WORLD'|capitalize }} {{ 'hello world-foo (bar [baz <q'|title }} {{ \"it's o'neil\"|title }}",
    "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '.') }} {{ n|replace('5', 'five') }}",
    "{{ d|items|list }} {{ undefined_name|items|list }} {% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}",
    "{{ none|items|list }}",
    "{{ 'abc'|list }} {{ d|list }} {{ lst|list }} {{ n|string }} {{ lst|string }} {{ none|string }} {{ (n|string) ~ 'x' }}",
    "{{ num_str|int }} {{ float_str|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ -3.9|int }} {{ t|int }} {{ 'ff'|int(base=16) }} {{ '1_000'|int }}",
    "{{ num_str|float }} {{ 'x'|float }} {{ 3|float }} {{ float_str|float }}",
    // out-of-range numbers: Python's float() gives inf / 0 where std::stod throws (fuzz_chat_template crash)
    "{{ 52e12029 }} {{ -1e999 }} {{ 0x000000000/52e12029 }} {{ 1e-400 }} {{ '1e999'|float }} {{ '-1e999'|int }} {{ '1e999'|int(3) }}",
    "{{ nested|map(attribute='99999999999999999999')|list }} {{ nested|map(attribute='0000000000000000000001')|list }}",
    "{{ [undefined_name] }} {{ (undefined_name,) }} {{ {'a': undefined_name} }} {{ [d.missing, 1]|string }}",
    "{{ undefined_name|int }}",
    "{{ -3|abs }} {{ -2.5|abs }} {{ lst|sort }} {{ lst|sort(reverse=true) }} {{ strs|sort }} {{ strs|sort(case_sensitive=true) }} {{ strs|unique|list }} {{ [1, 2, 1]|unique|list }}",
    "{{ lst|reverse|list }} {{ 'abc'|reverse }} {{ lst|min }} {{ lst|max }} {{ strs|max }} {{ lst|sum }} {{ [1.5, 2]|sum }} {{ messages|selectattr('tool_calls')|list|length }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='role')|list }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}",
    "{{ lst|select('odd')|list }} {{ lst|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ lst|map('string')|list }} {{ strs|map('upper')|join }}",
    "{{ messages|map(attribute='missing', default='-')|list }} {{ messages|map(attribute='tool_calls.0.function.name')|list }}",
    "{{ 'line1\nline2\n\nline4'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }}|{{ 'a\nb'|indent(first=true, width=1) }}",
    "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<b>'|safe }}",
    // tojson (transformers' override)
    "{{ tools|tojson }}",
    "{{ tools|tojson(indent=4) }}",
    "{{ messages[2]|tojson(indent=2, sort_keys=true) }}",
    "{{ {'é': 'ü', 'c': ctrl, 'e': emoji}|tojson }} {{ {'é': 'ü', 'e': emoji}|tojson(ensure_ascii=true) }}",
    "{{ d|tojson(separators=(',', ':')) }} {{ [1.0, 1e20, 0.1, -0.0, 1e-7, t, none]|tojson }} {{ 'a/b<c>&'|tojson }} {{ []|tojson(indent=2) }} {{ {}|tojson(indent=2) }}",
    "{{ lst|tojson(indent='\\t') }}",
    "{{ undefined_name|tojson }}",
    // string methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a  b'.split(none, 1) }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.startswith(('x', 'H')) }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.endswith('x') }} {{ 'Hello'.startswith('l', 2) }}",
    "{{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello wORLD'.title() }} {{ \"it's\".title() }} {{ 'hELLO'.capitalize() }} {{ 'aXbX'.replace('X', '-') }} {{ 'aXbX'.replace('X', '-', 1) }}",
    "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }}",
    "{{ 'prefix-body'.removeprefix('prefix-') }} {{ 'body.txt'.removesuffix('.txt') }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} {{ '  '.isspace() }}",
    "{{ s.nosuchmethod }}|{{ lst.index(1) }} {{ lst.count(3) }}",
    "{{ s.nosuchmethod() }}",
    "{{ lst.append(4) }}",
    // dict methods
    "{% for k, v in d.items() %}{{ k }}:{{ v }},{% endfor %} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }}",
    "{{ d.pop('a') }}",
    // for loops
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
    "{% for x in lst if x > 1 %}{{ loop.index }}:{{ x }}:{{ loop.length }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}",
    "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in undefined_name %}{{ x }}{% else %}undef-empty{% endfor %}",
    "{% for x in none %}{{ x }}{% endfor %}",
    "{% for a, b in nested %}{{ a }}+{{ b }};{% endfor %}{% for (a, b) in [[1, 2]] %}{{ a }}{{ b }}{% endfor %}",
    "{% for c in 'héllo' %}{{ c }}.{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for row in nested %}{% for x in row %}{{ loop.index }}{{ x }}{% endfor %}|{{ loop.index }}{% endfor %}",
    "{% for x in lst %}{{ loop.cycle('odd', 'even') }}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(2, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    // scoping
    "{% set x = 1 %}{% for i in lst %}{% set x = i %}[{{ x }}]{% endfor %}{{ x }}",
    "{% for i in lst %}[{{ y }}]{% set y = i %}{% endfor %}|{{ y }}",
    "{% set x = 9 %}{% for i in lst %}{% if i > 1 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}|{{ x }}",
    "{% if t %}{% set z = 'set in if' %}{% endif %}{{ z }}",
    "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }} {{ ns }}",
    "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}{{ ns['a'] }}",
    "{% set x = 1 %}{% set x.y = 2 %}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}",
    "{% set blk %}inner {{ n }}\n{% endset %}[{{ blk }}]{% set up | upper | trim %} shout {% endset %}[{{ up }}]",
    // macros and call
    "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(punct='.', name='Cy') }} [{{ greet() }}]",
    "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}",
    "{% macro show(v) %}{% if v is mapping %}{% for k, x in v.items() %}<{{ k }}>{{ show(x) }}</{{ k }}>{% endfor %}{% elif v is iterable and v is not string %}{% for x in v %}<item>{{ show(x) }}</item>{% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}{{ show(messages[2].tool_calls[0].function.arguments) }}",
    "{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}{% set g = 'changed' %}{{ m() }}",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}",
    "{% macro list_it(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) list_it(lst) %}[{{ x }}]{% endcall %}",
    "{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}",
    "{% filter upper %}shout {{ n }}{% endfilter %}{% filter replace('a', 'o') | title %}banana bread{% endfilter %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    // raise_exception and strftime_now
    "{% if n > 3 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}",
    "{{ strftime_now('%Y') | length }}",
    "{{ dict(a=1, b='x') }} {{ dict(d) }}",
    "{{ range(200000)|length }}",
    // whitespace control, trim_blocks, lstrip_blocks, comments, raw
    "  {% if t %}\n  indented\n  {% endif %}\nafter",
    "a\n  {%- if t -%}\n  b  \n  {%- endif -%}  \nc",
    "x  {{- n -}}  y {{ n -}}\n\n z {{+ n }}",
    "  {%+ if t %}kept-lstrip{% endif +%}\nkept-trim\n{% if t %}\ntrimmed{% endif %}",
    "{# comment #}\n  {# indented comment #}\nline\n{#- stripped -#}   after {#+ plus #}x",
    "a {% raw %}{{ not rendered }} {% if %}{% endraw %} b\n  {% raw -%}  x  {%- endraw %}\ny",
    "text with { braces } and {x} and % percent and # hash",
    "one\r\ntwo\rthree\n",
    "trailing newline kept once\n\n",
    "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U: {{ m.content }}\n    {% else %}\n        {{ m.role }}\n    {% endif %}\n{% endfor %}\n",
    "\t{% if t %}tab-indented{% endif %}\n\u00a0 {% if t %}nbsp-indented{% endif %}\n",
    "{{ 'x' }}\n{{ 'y' }}\n{% set q = 1 %}\n{{ q }}",
    // if/elif/else
    "{% if n < 3 %}small{% elif n < 10 %}medium{% elif n < 100 %}large{% else %}huge{% endif %}",
    "{% if undefined_name %}u{% elif none %}n{% elif [] %}l{% else %}else{% endif %}",
    "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}{{ sys }}|{{ rest|length }}",
    // content parts, typical chat-template idioms
    "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}|{% endfor %}",
    "{% for m in messages %}{% if m.tool_calls is defined and m.tool_calls %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){% endfor %}{% endif %}{% endfor %}",
    "{%- set last_user = namespace(i=-1) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set last_user.i = loop.index0 -%}{%- endif -%}{%- endfor -%}{{ last_user.i }}",
    "{{ messages|selectattr('role', 'in', ['user', 'system'])|list|length }} {{ (messages|last).role }} {{ messages|map(attribute='role')|unique|list }}",
    "{{ bos_token }}{{ eos_token is defined }}{{ add_generation_prompt }}{% if add_generation_prompt is defined and add_generation_prompt %}gen{% endif %}",
};

TEST(ChatTemplateConstructs, MatchJinja2) {
  if (!m3::test::have_jinja2()) GTEST_FAIL() << "python3 with jinja2 is required (scripts/py-deps.txt)";
  ordered_json context = ordered_json::parse(kContext);
  ordered_json spec = {{"templates", ordered_json::object()}, {"cases", ordered_json::array()}};
  for (const auto& src : kCases) spec["cases"].push_back({{"source", src}, {"context", context}});
  auto want = m3::test::run_jinja_oracle(spec);
  ASSERT_EQ(want.size(), kCases.size());
  int rendered = 0, raised = 0;
  for (size_t i = 0; i < kCases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ": " + m3::test::escape_for_report(kCases[i]));
    bool ok = true;
    std::string got;
    try {
      got = ChatTemplate::compile(kCases[i]).render(context);
    } catch (const std::exception& e) {
      ok = false;
      got = e.what();
    }
    if (want[i].ok) {
      ++rendered;
      EXPECT_TRUE(ok) << "jinja2 renders " << m3::test::escape_for_report(want[i].text) << "\n  m3 raised: " << got;
      if (ok) EXPECT_EQ(m3::test::first_difference(want[i].text, got), "");
    } else {
      ++raised;
      EXPECT_FALSE(ok) << "jinja2 raises (" << want[i].text << ")\n  m3 renders: " << m3::test::escape_for_report(got);
    }
  }
  std::printf("[constructs] %zu templates compared with jinja2: %d rendered, %d raised in both\n", kCases.size(), rendered, raised);
}

}  // namespace
