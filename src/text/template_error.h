#pragma once
// Errors of the chat-template engine. Every error a caller sees is a TemplateError: load errors
// (syntax, unsupported constructs) and render errors carry the template line and column (1-based,
// column in bytes); raise_exception() in a template is Kind::Raised with the template's message.
#include <stdexcept>
#include <string>

namespace m3::text::tmpl {

class TemplateError : public std::runtime_error {
 public:
  enum class Kind { Syntax, Unsupported, Render, Raised, Limit };
  TemplateError(Kind kind, int line, int column, const std::string& message);
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  int column() const { return column_; }
  // The message without the "line L, column C" prefix.
  const std::string& message() const { return message_; }

 private:
  Kind kind_;
  int line_, column_;
  std::string message_;
};

// Thrown by value operations and builtins, which know no position; the renderer turns it into a
// TemplateError at the innermost expression being evaluated.
class ValueError : public std::runtime_error {
 public:
  explicit ValueError(const std::string& message, bool raised = false)
      : std::runtime_error(message), raised_(raised) {}
  bool raised() const { return raised_; }

 private:
  bool raised_;
};

}  // namespace m3::text::tmpl
