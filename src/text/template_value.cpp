#include "text/template_value.h"

#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "text/template_error.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {

namespace {

std::atomic<int64_t> g_live[3];

// The containers (and callables, which may hold one) inside a container being destroyed, moved out
// of it so that they are freed by the loop in unnest(), not by nested destructors. (All of them,
// shared or not: a value two of its items share would otherwise be freed by the second one's
// destructor, recursively.)
thread_local std::vector<Value>* g_doomed = nullptr;

bool may_nest(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::List:
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
    case Value::Kind::Callable: return true;
    default: return false;
  }
}

template <class TakeItems>
void unnest(TakeItems take) {
  if (g_doomed) {  // inside an outer container's destructor: its loop frees them
    take(*g_doomed);
    return;
  }
  std::vector<Value> doomed;
  g_doomed = &doomed;
  take(doomed);
  while (!doomed.empty()) {
    Value v = std::move(doomed.back());
    doomed.pop_back();
  }  // (~v may add its own items to doomed)
  g_doomed = nullptr;
}

// One level of repr / == / <.
struct NestGuard {
  static thread_local int depth;
  explicit NestGuard(const char* op) {
    if (++depth > kMaxValueNesting) {
      --depth;
      throw ValueError(std::string("render limit: ") + op + " of a value nested deeper than " +
                       std::to_string(kMaxValueNesting) + " levels (or holding itself)");
    }
  }
  ~NestGuard() { --depth; }
};
thread_local int NestGuard::depth = 0;

thread_local size_t g_print_budget = SIZE_MAX;
thread_local uint64_t g_element_budget = UINT64_MAX;  // elements left
thread_local uint64_t g_element_limit = UINT64_MAX;   // for the message

[[noreturn]] void throw_elements() {
  throw ValueError("render limit: lists of more than " + std::to_string(g_element_limit) +
                   " elements built in all (each list built counts its elements)");
}

}  // namespace

ElementBudget::ElementBudget(uint64_t elements) : saved_(g_element_budget) {
  g_element_budget = elements;
  g_element_limit = elements;
}
ElementBudget::~ElementBudget() { g_element_budget = saved_; }

void check_elements(uint64_t elements) {
  if (elements > g_element_budget) throw_elements();
}

PrintBudget::PrintBudget(size_t bytes) : saved_(g_print_budget) { g_print_budget = bytes; }
PrintBudget::~PrintBudget() { g_print_budget = saved_; }

void check_print_size(size_t bytes) {
  if (bytes > g_print_budget)
    throw ValueError("render limit: a string or the output exceeds " + std::to_string(g_print_budget) + " bytes");
}

ListData::~ListData() {
  unnest([this](std::vector<Value>& out) {
    for (auto& v : items)
      if (may_nest(v)) out.push_back(std::move(v));
  });
}

DictData::~DictData() {
  unnest([this](std::vector<Value>& out) {
    for (auto& kv : items)
      if (may_nest(kv.second)) out.push_back(std::move(kv.second));
  });
}

void detail::count_live(Live kind, int delta) { g_live[static_cast<int>(kind)].fetch_add(delta, std::memory_order_relaxed); }

LiveObjects live_objects() {
  LiveObjects o;
  o.scopes = g_live[static_cast<int>(detail::Live::Scope)].load();
  o.namespaces = g_live[static_cast<int>(detail::Live::Namespace)].load();
  o.callables = g_live[static_cast<int>(detail::Live::Callable)].load();
  return o;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* DictData::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void DictData::set(std::string key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return;
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::list(std::vector<Value> items, bool tuple) {
  if (items.size() > g_element_budget) throw_elements();
  g_element_budget -= items.size();
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictData>()); }

Value Value::callable(std::string name, std::function<Value(CallArgs&, Renderer&)> fn) {
  auto c = std::make_shared<CallableData>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value(std::move(c));
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return v.list_ptr()->tuple ? "tuple" : "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
  }
  return "?";
}

void fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  throw ValueError(hint.empty() ? "value is undefined" : hint);
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.as_bool();
    case Value::Kind::Int: return v.as_int() != 0;
    case Value::Kind::Float: return v.as_float() != 0.0;
    case Value::Kind::String: return !v.str().empty();
    case Value::Kind::List: return !v.list_ptr()->items.empty();
    case Value::Kind::Dict: return !v.dict_ptr()->items.empty();
    default: return true;
  }
}

bool py_parse_float(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) return false;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);  // ERANGE is not an error here: +-HUGE_VAL or 0, as Python
  if (end != s.c_str() + s.size()) return false;
  *out = d;
  return true;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (exp + 1 >= n) {
      out += digits;
      out.append(static_cast<size_t>(exp + 1 - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp + 1));
      out += ".";
      out += digits.substr(static_cast<size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) {
    out += ".";
    out += digits.substr(1);
  }
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  out += eb;
  return out;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      char b[8];
      std::snprintf(b, sizeof b, "\\udc%02x", static_cast<unsigned>(c - 0xDC00));
      out += b;
    } else if (!py_isprintable(c)) {
      char b[16];
      if (c < 0x100) std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

static std::string repr_dict(const DictData& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += repr_string(k);
    out += ": ";
    out += repr(v);
    check_print_size(out.size());
  }
  return out + "}";
}

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return repr_string(v.str());
    case Value::Kind::Undefined: return "Undefined";  // Python's repr of jinja2's Undefined (in a list, say)
    case Value::Kind::List: {
      NestGuard guard("printing");
      const ListData& l = *v.list_ptr();
      std::string out = l.tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += repr(l.items[i]);
        check_print_size(out.size());
      }
      if (l.tuple && l.items.size() == 1) out += ",";
      return out + (l.tuple ? ")" : "]");
    }
    case Value::Kind::Dict: {
      NestGuard guard("printing");
      return repr_dict(*v.dict_ptr());
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return py_float_repr(v.as_float());
    case Value::Kind::String: return v.str();
    case Value::Kind::List:
    case Value::Kind::Dict: return repr(v);
    case Value::Kind::Namespace: {
      NestGuard guard("printing");
      return "<Namespace " + repr_dict(*v.ns_ptr()->attrs) + ">";
    }
    case Value::Kind::Callable: return "<function " + v.callable_ptr()->name + ">";
  }
  return "";
}

static bool numeric(const Value& v, double& d, bool& is_int, int64_t& i) {
  switch (v.kind()) {
    case Value::Kind::Bool: i = v.as_bool(); d = static_cast<double>(i); is_int = true; return true;
    case Value::Kind::Int: i = v.as_int(); d = static_cast<double>(i); is_int = true; return true;
    case Value::Kind::Float: d = v.as_float(); is_int = false; return true;
    default: return false;
  }
}

bool equals(const Value& a, const Value& b) {
  double da, db;
  bool ia, ib;
  int64_t xa, xb;
  if (numeric(a, da, ia, xa) && numeric(b, db, ib, xb)) {
    if (ia && ib) return xa == xb;
    return da == db;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::List: {
      NestGuard guard("comparing");
      const ListData& la = *a.list_ptr();
      const ListData& lb = *b.list_ptr();
      if (la.tuple != lb.tuple || la.items.size() != lb.items.size()) return false;
      for (size_t i = 0; i < la.items.size(); ++i)
        if (!equals(la.items[i], lb.items[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      NestGuard guard("comparing");
      const DictData& da2 = *a.dict_ptr();
      const DictData& db2 = *b.dict_ptr();
      if (da2.items.size() != db2.items.size()) return false;
      for (const auto& [k, v] : da2.items) {
        const Value* o = db2.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Namespace: return a.ns_ptr() == b.ns_ptr();
    case Value::Kind::Callable: return a.callable_ptr() == b.callable_ptr();
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  double da, db;
  bool ia, ib;
  int64_t xa, xb;
  if (numeric(a, da, ia, xa) && numeric(b, db, ib, xb)) {
    if (ia && ib) return xa < xb;
    return da < db;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order = code point order
  if (a.is_list() && b.is_list() && a.list_ptr()->tuple == b.list_ptr()->tuple) {
    NestGuard guard("ordering");
    const auto& la = a.list_ptr()->items;
    const auto& lb = b.list_ptr()->items;
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i) {
      if (equals(la[i], lb[i])) continue;
      return less(la[i], lb[i]);
    }
    return la.size() < lb.size();
  }
  throw ValueError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.list_ptr()->items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict_ptr()->items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      std::u32string u = utf8_decode(v.str());
      for (char32_t c : u) {
        std::string s;
        utf8_append(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default: throw ValueError("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(utf8_length(v.str()));
    case Value::Kind::List: return static_cast<int64_t>(v.list_ptr()->items.size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict_ptr()->items.size());
    default: throw ValueError("object of type '" + type_name(v) + "' has no len()");
  }
}

}  // namespace m3::text::tmpl
