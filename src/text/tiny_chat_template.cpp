#include "text/tiny_chat_template.h"

namespace m3::text {

std::string_view tiny_chat_template() {
  static constexpr std::string_view kTemplate = R"~~({#- MiniMax-M3-style chat template, written for m3mono's tests from the turn layout described in
    docs/ecosystem-notes.md 1.1 (the checkpoint's own chat_template.jinja is not available here):
    a system turn with identity and thinking instructions, a developer turn with the caller's
    system/developer text and the tools, user / ai / tool turns, the namespaced tool-call XML
    (to_xml), <mm:think> on turns after the last user message and a bare </mm:think> before,
    and the generation prompt prefilled by thinking_mode (enabled / disabled / adaptive). -#}
{%- set NS = ']<]minimax[>[' -%}
{%- set mode = thinking_mode if thinking_mode is defined and thinking_mode is not none else 'adaptive' -%}
{%- if mode not in ['enabled', 'disabled', 'adaptive'] -%}
    {{- raise_exception("thinking_mode must be 'enabled', 'disabled' or 'adaptive', got '" ~ mode ~ "'") -}}
{%- endif -%}
{%- set mode_text = {
    'enabled': 'Current thinking mode: enabled. Think step by step before every reply, also after tool results.',
    'disabled': 'Current thinking mode: disabled. Reply directly, without a thinking section.',
    'adaptive': 'Current thinking mode: adaptive. Think when the turn needs several steps or tool results need weighing.'
} -%}
{%- macro content_text(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is sequence -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part.type in ['image', 'image_url'] -%}
                {{- ']<]image[>[' -}}
            {%- else -%}
                {{- raise_exception('unsupported content part type: ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro to_xml(value) -%}
    {%- if value is mapping -%}
        {%- for key, item in value.items() -%}
            {{- NS }}<{{ key }}>{{ to_xml(item) }}{{ NS }}</{{ key }}>
        {%- endfor -%}
    {%- elif value is sequence and value is not string -%}
        {%- for item in value -%}
            {{- NS }}<item>{{ to_xml(item) }}{{ NS }}</item>
        {%- endfor -%}
    {%- elif value is none -%}
        {{- 'null' -}}
    {%- elif value is boolean -%}
        {{- 'true' if value else 'false' -}}
    {%- else -%}
        {{- value -}}
    {%- endif -%}
{%- endmacro -%}
{#- system and developer messages fold into the developer turn -#}
{%- set dev = namespace(parts=[], last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role in ['system', 'developer'] -%}
        {%- set dev.parts = dev.parts + [content_text(m.content) | trim] -%}
    {%- elif m.role == 'user' -%}
        {%- set dev.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
]~!b[]~b]system
Your model version is MiniMax-M3-style (a test template).

<thinking_instructions>
Wrap reasoning in <mm:think></mm:think> before the reply when thinking is on.
{{ mode_text[mode] }}
</thinking_instructions>[e~[
]~b]developer
{% if dev.parts %}
{{ dev.parts | join('\n\n') }}
{%- else %}
You are a helpful assistant.
{%- endif %}
{% if tools is defined and tools %}


<tools>
    {% for tool in tools %}
{{ (tool.function if tool.function is defined else tool) | tojson(ensure_ascii=False) }}
    {% endfor %}
</tools>

To call tools, answer with one block per turn:
{{ NS }}<tool_call>
{{ NS }}<invoke name="TOOL">{{ NS }}<ARGUMENT>VALUE{{ NS }}</ARGUMENT>{{ NS }}</invoke>
{{ NS }}</tool_call>
{% endif %}
[e~[
{% for m in messages %}
    {%- set role = m.role -%}
    {%- if role in ['system', 'developer'] -%}
    {%- elif role == 'user' %}
]~b]user
{{ content_text(m.content) }}[e~[
    {% elif role in ['assistant', 'ai'] %}
        {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}
]~b]ai
        {% if loop.index0 > dev.last_user and reasoning | trim | length > 0 %}
<mm:think>{{ reasoning | trim }}</mm:think>
        {%- else %}
</mm:think>
        {%- endif %}
{{ content_text(m.content) | trim }}
        {%- if m.tool_calls is defined and m.tool_calls %}

{{ NS }}<tool_call>
            {% for call in m.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
{{ NS }}<invoke name="{{ fn.name }}">
                {%- if fn.arguments is string -%}
                    {{ fn.arguments }}
                {%- else -%}
                    {%- for name, arg in (fn.arguments or {}).items() -%}
                        {{ NS }}<{{ name }}>{{ to_xml(arg) }}{{ NS }}</{{ name }}>
                    {%- endfor -%}
                {%- endif -%}
{{ NS }}</invoke>
            {% endfor %}
{{ NS }}</tool_call>
        {%- endif %}
[e~[
    {% elif role == 'tool' %}
        {% if loop.first or messages[loop.index0 - 1].role != 'tool' %}
]~b]tool
        {% endif %}
<response>{{ content_text(m.content) }}</response>
        {% if loop.last or messages[loop.index0 + 1].role != 'tool' %}
[e~[
        {% endif %}
    {% else %}
        {{- raise_exception("unknown role '" ~ role ~ "' (expected system, developer, user, assistant/ai or tool)") }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
]~b]ai
{% if mode == 'enabled' %}<mm:think>{% elif mode == 'disabled' %}</mm:think>{% endif %}
{% endif %}
)~~";
  return kTemplate;
}

}  // namespace m3::text
