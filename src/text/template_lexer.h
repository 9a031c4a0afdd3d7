#pragma once
// The lexer of the chat-template engine: splits a Jinja2 template into text and tag tokens, with
// jinja2's whitespace rules (`{%-`/`-%}`, `{{-`/`-}}`, `{#-`/`-#}`, `+` to opt out, trim_blocks,
// lstrip_blocks) and its newline handling (\r\n and \r read as \n; one trailing newline dropped,
// keep_trailing_newline=False).
#include <string>
#include <string_view>
#include <vector>

namespace m3::text::tmpl {

struct LexOptions {
  bool trim_blocks = true;    // as transformers configures jinja2
  bool lstrip_blocks = true;
};

struct Token {
  enum class Type { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, Eof };
  Type type;
  std::string value;  // text for Data, unescaped content for String, the spelling otherwise
  int line = 1;
  int column = 1;
};

// Raises TemplateError (Kind::Syntax) with the position of a malformed token.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

}  // namespace m3::text::tmpl
