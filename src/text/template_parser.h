#pragma once
// The parser of the chat-template engine: the statements and expressions of the Jinja2 subset
// that Hugging Face chat templates use. Anything outside it (include, extends, block, unknown
// filters or tests, recursive loops, ...) is a load error naming the construct, line and column.
#include <memory>
#include <string_view>

#include "text/template_ast.h"
#include "text/template_lexer.h"

namespace m3::text::tmpl {

struct Program {
  Body body;
};

std::shared_ptr<const Program> parse_template(std::string_view source, const LexOptions& options);

}  // namespace m3::text::tmpl
