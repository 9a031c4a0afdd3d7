#pragma once
// Builtin filters, tests, methods and globals of the chat-template engine (jinja2's semantics as
// transformers configures it: tojson as json.dumps(ensure_ascii=False), raise_exception,
// strftime_now, immutable sandbox: methods that modify lists or dicts are refused).
#include <optional>
#include <string>
#include <string_view>

#include "text/template_value.h"

namespace m3::text::tmpl {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

Value apply_filter(Renderer& r, std::string_view name, Value subject, CallArgs& args);
bool apply_test(Renderer& r, std::string_view name, const Value& subject, CallArgs& args);

// The bound method obj.name, or nullopt when obj's type has none of that name.
std::optional<Value> get_method(const Value& obj, const std::string& name);

// The globals every template sees (below the render context): range, namespace, dict,
// raise_exception, strftime_now.
std::optional<Value> get_global(std::string_view name);

// Reads the arguments of a builtin by position or keyword, as Python binds them.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string func) : a_(args), func_(std::move(func)) {}
  // The argument at position pos (counted after the subject) or the keyword name; def if neither.
  Value get(size_t pos, const char* name, Value def = Value());
  bool has(size_t pos, const char* name) const;
  // Fails when arguments were left unread.
  void done(size_t npos) const;

 private:
  CallArgs& a_;
  std::string func_;
  std::vector<std::string> read_kw_;
};

// Helpers shared by builtins.
int64_t to_index(const Value& v, const char* what);
std::string str_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count);
std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit);

}  // namespace m3::text::tmpl
