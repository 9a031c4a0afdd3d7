#pragma once
// Values of the chat-template engine: Python's types as Jinja2 sees them (None, bool, int, float,
// str, list, tuple, dict with insertion order) plus jinja2's default Undefined, namespaces and
// callables (macros, bound methods, globals).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace m3::text::tmpl {

struct Value;
class Renderer;

// How many objects of each kind of the engine are alive in this process: render scopes,
// namespaces and callables (macros, bound methods, globals). A render must free everything it made,
// reference cycles included; the tests compare these before and after one.
struct LiveObjects {
  int64_t scopes = 0, namespaces = 0, callables = 0;
};
LiveObjects live_objects();

namespace detail {
enum class Live { Scope, Namespace, Callable };
void count_live(Live kind, int delta);
// A member that counts the object holding it (copies too) in live_objects().
template <Live K>
struct LiveMark {
  LiveMark() { count_live(K, 1); }
  LiveMark(const LiveMark&) { count_live(K, 1); }
  LiveMark& operator=(const LiveMark&) { return *this; }
  ~LiveMark() { count_live(K, -1); }
};
}  // namespace detail

struct Undefined {
  std::string hint;  // the message an operation that needs a value fails with
};

// Values a template builds may nest without bound (ns.x = [ns.x] in a loop): containers free
// their items in a loop rather than by recursion, and the recursive operations (repr, ==, <) stop
// at kMaxValueNesting levels with a render-limit error.
inline constexpr int kMaxValueNesting = 512;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  ~ListData();
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
  ~DictData();
};

struct NamespaceData {
  std::shared_ptr<DictData> attrs;
  detail::LiveMark<detail::Live::Namespace> live;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct CallableData {
  std::string name;
  std::function<Value(CallArgs&, Renderer&)> fn;
  detail::LiveMark<detail::Live::Callable> live;
};

using ListPtr = std::shared_ptr<ListData>;
using DictPtr = std::shared_ptr<DictData>;
using NamespacePtr = std::shared_ptr<NamespaceData>;
using CallablePtr = std::shared_ptr<CallableData>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, ListPtr, DictPtr,
               NamespacePtr, CallablePtr>
      v;

  Value() : v(Undefined{}) {}
  Value(std::nullptr_t) : v(nullptr) {}
  Value(bool b) : v(b) {}
  Value(int i) : v(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v(i) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(ListPtr l) : v(std::move(l)) {}
  Value(DictPtr d) : v(std::move(d)) {}
  Value(NamespacePtr n) : v(std::move(n)) {}
  Value(CallablePtr c) : v(std::move(c)) {}
  Value(Undefined u) : v(std::move(u)) {}

  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict();
  static Value callable(std::string name, std::function<Value(CallArgs&, Renderer&)> fn);

  Kind kind() const { return static_cast<Kind>(v.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return kind() == Kind::Namespace; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<bool>(v); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_float() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(v); }
  const NamespacePtr& ns_ptr() const { return std::get<NamespacePtr>(v); }
  const CallablePtr& callable_ptr() const { return std::get<CallablePtr>(v); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v).hint; }
};

// Python's type name, as used in error messages ("dict object", "str", ...).
std::string type_name(const Value& v);
// Raises the undefined error of v (v must be undefined).
[[noreturn]] void fail_undefined(const Value& v);

// The most bytes one str / repr / tojson of a value may build before it stops with a render-limit
// error (a list repeated a million times must not be printed in full before the output limit sees
// it). The renderer holds one for its whole render (RenderLimits::max_output_bytes); without one
// there is no bound. Nests: the innermost applies; the destructor restores the one before.
class PrintBudget {
 public:
  explicit PrintBudget(size_t bytes);
  ~PrintBudget();
  PrintBudget(const PrintBudget&) = delete;
  PrintBudget& operator=(const PrintBudget&) = delete;

 private:
  size_t saved_;
};
// Throws the render-limit ValueError when a value's text has grown past the current budget.
void check_print_size(size_t bytes);

// The most list elements the lists built from now on may hold in all (Value::list charges each
// list's size): a loop that copies a big list, or a list repeated or doubled, is work the step
// limit does not see. The renderer holds one of RenderLimits::max_steps elements for its render;
// without one there is no bound. Nests like PrintBudget.
class ElementBudget {
 public:
  explicit ElementBudget(uint64_t elements);
  ~ElementBudget();
  ElementBudget(const ElementBudget&) = delete;
  ElementBudget& operator=(const ElementBudget&) = delete;

 private:
  uint64_t saved_;
};
// Throws the render-limit ValueError when `elements` more would not fit what is left (nothing
// is charged: the caller checks before it builds a large list).
void check_elements(uint64_t elements);

bool truthy(const Value& v);
// str(v) and repr(v) as Python prints them; undefined prints as "".
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string py_float_repr(double d);
// float(s) as Python reads a decimal number: overflow gives +-inf and underflow 0 where std::stod
// throws. False unless all of s is one number (hexadecimal floats, which Python rejects, included).
bool py_parse_float(const std::string& s, double* out);
// Python ==, and <, for the types Jinja2 compares (raises ValueError for unorderable types).
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
// The items a for loop sees: list/tuple items, dict keys, string characters; undefined is empty.
std::vector<Value> iterate(const Value& v);
// len(); raises for types without one.
int64_t length(const Value& v);

}  // namespace m3::text::tmpl
