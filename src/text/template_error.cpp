#include "text/template_error.h"

namespace m3::text::tmpl {

static std::string format(int line, int column, const std::string& message) {
  if (line <= 0) return "chat template: " + message;
  return "chat template: line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message;
}

TemplateError::TemplateError(Kind kind, int line, int column, const std::string& message)
    : std::runtime_error(format(line, column, message)), kind_(kind), line_(line), column_(column), message_(message) {}

}  // namespace m3::text::tmpl
