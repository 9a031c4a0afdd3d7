// The chat_template.jinja `m3mono make-tiny` writes next to its tokenizer.json: an M3-style
// template (docs/ecosystem-notes.md 1.1: ]~!b[ ]~b]system ... [e~[, developer / user / ai / tool
// turns, <mm:think> by thinking_mode, the ]<]minimax[>[ tool-call XML) over markers that are all
// added tokens of the tiny tokenizer (text/m3_tokens.h), so each encodes to one id. It is, byte
// for byte, tests/data/templates/m3_style.jinja, which the template matrix checks against Python
// jinja2 (test_template_matrix.cpp); test_make_tiny.cpp checks that the two stay equal.
#pragma once
#include <string_view>

namespace m3::text {

std::string_view tiny_chat_template();

}  // namespace m3::text
