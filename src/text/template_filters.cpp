// Filters and tests of the chat-template engine (jinja2 3.1 semantics; tojson as transformers
// overrides it).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>

#include "text/template_builtins.h"
#include "text/template_error.h"
#include "text/template_json.h"
#include "text/template_render.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {

// ---- argument binding ---------------------------------------------------------------------

bool ArgReader::has(size_t pos, const char* name) const {
  if (pos < a_.pos.size()) return true;
  for (const auto& kv : a_.kw)
    if (kv.first == name) return true;
  return false;
}

Value ArgReader::get(size_t pos, const char* name, Value def) {
  for (const auto& kv : a_.kw) {
    if (kv.first == name) {
      if (pos < a_.pos.size()) throw ValueError(func_ + "() got multiple values for argument '" + name + "'");
      read_kw_.push_back(name);
      return kv.second;
    }
  }
  if (pos < a_.pos.size()) return a_.pos[pos];
  return def;
}

void ArgReader::done(size_t npos) const {
  if (a_.pos.size() > npos)
    throw ValueError(func_ + "() takes at most " + std::to_string(npos) + " argument(s) (" + std::to_string(a_.pos.size()) + " given)");
  for (const auto& kv : a_.kw) {
    if (std::find(read_kw_.begin(), read_kw_.end(), kv.first) == read_kw_.end())
      throw ValueError(func_ + "() got an unexpected keyword argument '" + kv.first + "'");
  }
}

int64_t to_index(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  if (v.is_undefined()) fail_undefined(v);
  throw ValueError(std::string(what) + " must be an integer, not " + type_name(v));
}

static std::string soft_str(const Value& v) { return to_str(v); }

static std::string arg_str(const Value& v, const char* what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) fail_undefined(v);
  throw ValueError(std::string(what) + " must be a string, not " + type_name(v));
}

// ---- helpers ------------------------------------------------------------------------------

// Follows a dotted attribute path ("a.b", "0") as jinja2's make_attrgetter does.
static Value attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t index = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc())
      return Value::undefined("no item " + part);  // past int64: no list is that long, no int key that large
    cur = digits ? get_item(cur, Value(index)) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

static std::u32string capitalize_u(std::u32string u) {
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? py_upper(u[i]) : py_lower(u[i]);
  return u;
}

// jinja2's title filter: upper-cases the first character of each word, words split at
// whitespace and -({[< runs; the rest is lower-cased.
static std::string filter_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  std::u32string out;
  auto is_sep = [](char32_t c) { return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    if (is_sep(u[i])) {
      while (j < u.size() && is_sep(u[j])) ++j;
      out.append(u, i, j - i);
    } else {
      while (j < u.size() && !is_sep(u[j])) ++j;
      out += capitalize_u(u.substr(i, j - i));
    }
    i = j;
  }
  return utf8_encode(out);
}

static std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Python's str.splitlines().
static std::vector<std::string> splitlines(const std::string& s) {
  std::u32string u = utf8_decode(s);
  std::vector<std::string> lines;
  std::u32string cur;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
              c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!br) { cur.push_back(c); continue; }
    if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    lines.push_back(utf8_encode(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(utf8_encode(cur));
  return lines;
}

static Value make_sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(str_lower(v.str()));
  return v;
}

static Value py_int(const Value& v, const Value& def, int base) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.str(), true, true, nullptr);
    std::string t;
    for (char c : s) if (c != '_') t.push_back(c);
    try {
      size_t used = 0;
      long long x = std::stoll(t, &used, base);
      if (used == t.size() && !t.empty()) return Value(static_cast<int64_t>(x));
    } catch (...) {
    }
    double d = 0;
    if (py_parse_float(t, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
    return def;
  }
  return def;
}

static Value py_float(const Value& v, const Value& def) {
  if (v.is_float()) return v;
  if (v.is_int()) return Value(static_cast<double>(v.as_int()));
  if (v.is_bool()) return Value(v.as_bool() ? 1.0 : 0.0);
  if (v.is_string()) {
    double d = 0;
    if (py_parse_float(py_strip(v.str(), true, true, nullptr), &d)) return Value(d);
  }
  return def;
}

// ---- filters ------------------------------------------------------------------------------

using FilterFn = std::function<Value(Renderer&, Value&, CallArgs&)>;

static Value filter_tojson(Renderer& r, Value& v, CallArgs& a) {
  ArgReader ar(a, "tojson");
  JsonDumpOptions o;
  o.ensure_ascii = truthy(ar.get(0, "ensure_ascii", Value(false)));
  Value indent = ar.get(1, "indent", Value(nullptr));
  if (indent.is_int() || indent.is_bool()) {
    int64_t n = indent.is_int() ? indent.as_int() : indent.as_bool();
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  } else if (indent.is_string()) {
    o.indent = indent.str();
  } else if (!indent.is_none()) {
    throw ValueError("tojson: indent must be an integer or a string");
  }
  Value seps = ar.get(2, "separators", Value(nullptr));
  if (seps.is_list()) {
    const auto& it = seps.list_ptr()->items;
    if (it.size() != 2 || !it[0].is_string() || !it[1].is_string())
      throw ValueError("tojson: separators must be a pair of strings");
    o.item_separator = it[0].str();
    o.key_separator = it[1].str();
  } else if (!seps.is_none()) {
    throw ValueError("tojson: separators must be a pair of strings");
  }
  o.sort_keys = truthy(ar.get(3, "sort_keys", Value(false)));
  ar.done(4);
  std::string s = dumps(v, o);
  r.check_size(s.size());
  return Value(std::move(s));
}

static Value filter_join(Renderer& r, Value& v, CallArgs& a) {
  ArgReader ar(a, "join");
  Value d = ar.get(0, "d", Value(""));
  Value attribute = ar.get(1, "attribute", Value(nullptr));
  ar.done(2);
  std::string sep = soft_str(d);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(attribute.is_none() ? item : attr_path(item, to_str(attribute)));
    r.check_size(out.size());
  }
  return Value(std::move(out));
}

static std::vector<Value> select_items(Renderer& r, Value& v, CallArgs& a, bool attr_mode, bool keep_if) {
  size_t first = 0;
  std::string attr;
  if (attr_mode) {
    if (a.pos.empty()) throw ValueError("selectattr/rejectattr need an attribute name");
    attr = arg_str(a.pos[0], "attribute");
    first = 1;
  }
  std::string test;
  CallArgs test_args;
  if (a.pos.size() > first) {
    test = arg_str(a.pos[first], "test name");
    if (!has_test(test)) throw ValueError("no test named '" + test + "'");
    test_args.pos.assign(a.pos.begin() + static_cast<long>(first) + 1, a.pos.end());
    test_args.kw = a.kw;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    r.step();
    Value subject = attr_mode ? attr_path(item, attr) : item;
    CallArgs ta = test_args;
    bool ok = test.empty() ? truthy(subject) : apply_test(r, test, subject, ta);
    if (ok == keep_if) out.push_back(item);
  }
  return out;
}

static Value filter_map(Renderer& r, Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* def = nullptr;
  for (const auto& kv : a.kw) {
    if (kv.first == "attribute") attribute = &kv.second;
    else if (kv.first == "default") def = &kv.second;
  }
  if (attribute) {
    std::string path = to_str(*attribute);
    for (const Value& item : iterate(v)) {
      r.step();
      Value x = attr_path(item, path);
      if (x.is_undefined() && def) x = *def;
      out.push_back(std::move(x));
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) throw ValueError("map: a filter name or attribute= is required");
  std::string name = arg_str(a.pos[0], "filter name");
  if (!has_filter(name)) throw ValueError("no filter named '" + name + "'");
  for (const Value& item : iterate(v)) {
    r.step();
    CallArgs fa;
    fa.pos.assign(a.pos.begin() + 1, a.pos.end());
    fa.kw = a.kw;
    out.push_back(apply_filter(r, name, item, fa));
  }
  return Value::list(std::move(out));
}

static Value filter_indent(Renderer& r, Value& v, CallArgs& a) {
  ArgReader ar(a, "indent");
  Value width = ar.get(0, "width", Value(4));
  bool first = truthy(ar.get(1, "first", Value(false)));
  bool blank = truthy(ar.get(2, "blank", Value(false)));
  ar.done(3);
  std::string ind = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(to_index(width, "width"), 0)), ' ');
  std::string s = soft_str(v) + "\n";
  std::vector<std::string> lines = splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  r.check_size(rv.size());
  return Value(std::move(rv));
}

static const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = [] {
    std::map<std::string, FilterFn, std::less<>> t;
    t["tojson"] = filter_tojson;
    t["join"] = filter_join;
    t["map"] = filter_map;
    t["indent"] = filter_indent;
    t["abs"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "abs").done(0);
      if (v.is_int()) {
        if (v.as_int() == INT64_MIN) throw ValueError("integer overflow");
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      if (v.is_undefined()) fail_undefined(v);
      throw ValueError("bad operand type for abs(): '" + type_name(v) + "'");
    };
    t["capitalize"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "capitalize").done(0);
      return Value(utf8_encode(capitalize_u(utf8_decode(soft_str(v)))));
    };
    t["length"] = t["count"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "length").done(0);
      return Value(length(v));
    };
    t["default"] = t["d"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "default");
      Value def = ar.get(0, "default_value", Value(""));
      bool boolean = truthy(ar.get(1, "boolean", Value(false)));
      ar.done(2);
      if (v.is_undefined() || (boolean && !truthy(v))) return def;
      return v;
    };
    t["first"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "first").done(0);
      std::vector<Value> items = iterate(v);
      if (items.empty()) return Value::undefined("No first item, sequence was empty.");
      return items.front();
    };
    t["last"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "last").done(0);
      if (v.is_undefined()) fail_undefined(v);
      std::vector<Value> items = iterate(v);
      if (items.empty()) return Value::undefined("No last item, sequence was empty.");
      return items.back();
    };
    t["float"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "float");
      Value def = ar.get(0, "default", Value(0.0));
      ar.done(1);
      return py_float(v, def);
    };
    t["int"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "int");
      Value def = ar.get(0, "default", Value(0));
      int64_t base = to_index(ar.get(1, "base", Value(10)), "base");
      ar.done(2);
      if (v.is_undefined()) fail_undefined(v);
      return py_int(v, def, static_cast<int>(base));
    };
    t["items"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "items").done(0);
      if (v.is_undefined()) return Value::list({});
      if (!v.is_dict()) throw ValueError("Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, x] : v.dict_ptr()->items) out.push_back(Value::list({Value(k), x}, true));
      return Value::list(std::move(out));
    };
    t["list"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "list").done(0);
      return Value::list(iterate(v));
    };
    t["string"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "string").done(0);
      return Value(soft_str(v));
    };
    t["lower"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "lower").done(0);
      return Value(str_lower(soft_str(v)));
    };
    t["upper"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "upper").done(0);
      return Value(str_upper(soft_str(v)));
    };
    t["title"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "title").done(0);
      return Value(filter_title(soft_str(v)));
    };
    t["trim"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "trim");
      Value chars = ar.get(0, "chars", Value(nullptr));
      ar.done(1);
      std::string cs = chars.is_none() ? "" : arg_str(chars, "chars");
      return Value(py_strip(soft_str(v), true, true, chars.is_none() ? nullptr : &cs));
    };
    t["replace"] = [](Renderer& r, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "replace");
      std::string old = soft_str(ar.get(0, "old", Value::undefined("replace() missing argument 'old'")));
      std::string rep = soft_str(ar.get(1, "new", Value::undefined("replace() missing argument 'new'")));
      Value count = ar.get(2, "count", Value(nullptr));
      ar.done(3);
      std::string out = str_replace(soft_str(v), old, rep, count.is_none() ? -1 : to_index(count, "count"));
      r.check_size(out.size());
      return Value(std::move(out));
    };
    t["safe"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "safe").done(0);
      return v;
    };
    t["escape"] = t["e"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "escape").done(0);
      return Value(html_escape(soft_str(v)));
    };
    t["selectattr"] = [](Renderer& r, Value& v, CallArgs& a) { return Value::list(select_items(r, v, a, true, true)); };
    t["rejectattr"] = [](Renderer& r, Value& v, CallArgs& a) { return Value::list(select_items(r, v, a, true, false)); };
    t["select"] = [](Renderer& r, Value& v, CallArgs& a) { return Value::list(select_items(r, v, a, false, true)); };
    t["reject"] = [](Renderer& r, Value& v, CallArgs& a) { return Value::list(select_items(r, v, a, false, false)); };
    t["reverse"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader(a, "reverse").done(0);
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.str());
        std::reverse(u.begin(), u.end());
        return Value(utf8_encode(u));
      }
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    };
    t["sort"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "sort");
      bool rev = truthy(ar.get(0, "reverse", Value(false)));
      bool cs = truthy(ar.get(1, "case_sensitive", Value(false)));
      Value attribute = ar.get(2, "attribute", Value(nullptr));
      ar.done(3);
      std::vector<Value> items = iterate(v);
      std::vector<std::pair<Value, size_t>> keyed;
      for (size_t i = 0; i < items.size(); ++i)
        keyed.emplace_back(make_sort_key(attribute.is_none() ? items[i] : attr_path(items[i], to_str(attribute)), cs), i);
      std::stable_sort(keyed.begin(), keyed.end(), [rev](const auto& x, const auto& y) {
        return rev ? less(y.first, x.first) : less(x.first, y.first);
      });
      std::vector<Value> out;
      for (const auto& k : keyed) out.push_back(items[k.second]);
      return Value::list(std::move(out));
    };
    t["unique"] = [](Renderer&, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "unique");
      bool cs = truthy(ar.get(0, "case_sensitive", Value(false)));
      Value attribute = ar.get(1, "attribute", Value(nullptr));
      ar.done(2);
      std::vector<Value> out, seen;
      for (const Value& item : iterate(v)) {
        Value key = make_sort_key(attribute.is_none() ? item : attr_path(item, to_str(attribute)), cs);
        bool dup = false;
        for (const Value& s : seen) if (equals(s, key)) { dup = true; break; }
        if (dup) continue;
        seen.push_back(key);
        out.push_back(item);
      }
      return Value::list(std::move(out));
    };
    auto minmax = [](bool want_max) {
      return [want_max](Renderer&, Value& v, CallArgs& a) -> Value {
        ArgReader ar(a, want_max ? "max" : "min");
        bool cs = truthy(ar.get(0, "case_sensitive", Value(false)));
        Value attribute = ar.get(1, "attribute", Value(nullptr));
        ar.done(2);
        std::vector<Value> items = iterate(v);
        if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
        size_t best = 0;
        auto key = [&](size_t i) { return make_sort_key(attribute.is_none() ? items[i] : attr_path(items[i], to_str(attribute)), cs); };
        for (size_t i = 1; i < items.size(); ++i) {
          if (want_max ? less(key(best), key(i)) : less(key(i), key(best))) best = i;
        }
        return items[best];
      };
    };
    t["min"] = minmax(false);
    t["max"] = minmax(true);
    t["sum"] = [](Renderer& r, Value& v, CallArgs& a) -> Value {
      ArgReader ar(a, "sum");
      Value attribute = ar.get(0, "attribute", Value(nullptr));
      Value total = ar.get(1, "start", Value(0));
      ar.done(2);
      // reuse the renderer's + through a tiny expression-free path
      for (const Value& item : iterate(v)) {
        Value x = attribute.is_none() ? item : attr_path(item, to_str(attribute));
        CallArgs none;
        (void)none;
        if ((total.is_int() || total.is_bool()) && (x.is_int() || x.is_bool())) {
          int64_t res;
          int64_t t1 = total.is_int() ? total.as_int() : total.as_bool();
          int64_t x1 = x.is_int() ? x.as_int() : x.as_bool();
          if (__builtin_add_overflow(t1, x1, &res)) throw ValueError("integer overflow");
          total = Value(res);
        } else if (total.is_number() && x.is_number()) {
          auto d = [](const Value& q) { return q.is_float() ? q.as_float() : q.is_int() ? static_cast<double>(q.as_int()) : q.as_bool() ? 1.0 : 0.0; };
          total = Value(d(total) + d(x));
        } else {
          throw ValueError("sum: unsupported operand types '" + type_name(total) + "' and '" + type_name(x) + "'");
        }
        r.step();
      }
      return total;
    };
    return t;
  }();
  return table;
}

bool has_filter(std::string_view name) { return filters().count(name) > 0; }

Value apply_filter(Renderer& r, std::string_view name, Value subject, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw ValueError("no filter named '" + std::string(name) + "'");
  r.step();
  return it->second(r, subject, args);
}

// ---- tests --------------------------------------------------------------------------------

using TestFn = std::function<bool(Renderer&, const Value&, CallArgs&)>;

static const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = [] {
    std::map<std::string, TestFn, std::less<>> t;
    auto simple = [](const char* n, bool (*f)(const Value&)) {
      return [n, f](Renderer&, const Value& v, CallArgs& a) {
        ArgReader(a, n).done(0);
        return f(v);
      };
    };
    t["defined"] = simple("defined", [](const Value& v) { return !v.is_undefined(); });
    t["undefined"] = simple("undefined", [](const Value& v) { return v.is_undefined(); });
    t["none"] = simple("none", [](const Value& v) { return v.is_none(); });
    t["boolean"] = simple("boolean", [](const Value& v) { return v.is_bool(); });
    t["true"] = simple("true", [](const Value& v) { return v.is_bool() && v.as_bool(); });
    t["false"] = simple("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); });
    t["integer"] = simple("integer", [](const Value& v) { return v.is_int(); });
    t["float"] = simple("float", [](const Value& v) { return v.is_float(); });
    t["number"] = simple("number", [](const Value& v) { return v.is_number(); });
    t["string"] = simple("string", [](const Value& v) { return v.is_string(); });
    t["mapping"] = simple("mapping", [](const Value& v) { return v.is_dict(); });
    t["iterable"] = simple("iterable", [](const Value& v) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); });
    t["sequence"] = simple("sequence", [](const Value& v) { return v.is_string() || v.is_list() || v.is_dict(); });
    // jinja2's Undefined defines __call__ (raising), so callable() holds for it
    t["callable"] = simple("callable", [](const Value& v) { return v.is_callable() || v.is_undefined(); });
    t["escaped"] = simple("escaped", [](const Value&) { return false; });
    t["lower"] = simple("lower", [](const Value& v) {
      std::string s = to_str(v);
      return str_lower(s) == s && str_upper(s) != s;
    });
    t["upper"] = simple("upper", [](const Value& v) {
      std::string s = to_str(v);
      return str_upper(s) == s && str_lower(s) != s;
    });
    auto int_of = [](const Value& v) -> int64_t { return to_index(v, "value"); };
    t["even"] = [int_of](Renderer&, const Value& v, CallArgs& a) { ArgReader(a, "even").done(0); return int_of(v) % 2 == 0; };
    t["odd"] = [int_of](Renderer&, const Value& v, CallArgs& a) { ArgReader(a, "odd").done(0); return int_of(v) % 2 != 0; };
    t["divisibleby"] = [int_of](Renderer&, const Value& v, CallArgs& a) {
      ArgReader ar(a, "divisibleby");
      int64_t n = to_index(ar.get(0, "num", Value::undefined("divisibleby() missing argument 'num'")), "num");
      ar.done(1);
      if (n == 0) throw ValueError("integer division or modulo by zero");
      return int_of(v) % n == 0;
    };
    auto binary = [](const char* n, int op) {
      return [n, op](Renderer&, const Value& v, CallArgs& a) {
        ArgReader ar(a, n);
        Value o = ar.get(0, "other", Value::undefined(std::string(n) + "() missing argument"));
        ar.done(1);
        switch (op) {
          case 0: return equals(v, o);
          case 1: return !equals(v, o);
          case 2: return less(v, o);
          case 3: return less(v, o) || equals(v, o);
          case 4: return less(o, v);
          case 5: return less(o, v) || equals(v, o);
          default: {  // sameas: identity; for immutable values Python compares small values by value
            if (v.kind() != o.kind()) return false;
            if (v.is_list()) return v.list_ptr() == o.list_ptr();
            if (v.is_dict()) return v.dict_ptr() == o.dict_ptr();
            return equals(v, o);
          }
        }
      };
    };
    t["eq"] = t["equalto"] = t["=="] = binary("eq", 0);
    t["ne"] = t["!="] = binary("ne", 1);
    t["lt"] = t["lessthan"] = t["<"] = binary("lt", 2);
    t["le"] = t["<="] = binary("le", 3);
    t["gt"] = t["greaterthan"] = t[">"] = binary("gt", 4);
    t["ge"] = t[">="] = binary("ge", 5);
    t["sameas"] = binary("sameas", 6);
    t["in"] = [](Renderer&, const Value& v, CallArgs& a) {
      ArgReader ar(a, "in");
      Value seq = ar.get(0, "seq", Value::undefined("in() missing argument 'seq'"));
      ar.done(1);
      if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
      if (seq.is_dict()) return v.is_string() && seq.dict_ptr()->find(v.str()) != nullptr;
      for (const Value& x : iterate(seq))
        if (equals(x, v)) return true;
      return false;
    };
    return t;
  }();
  return table;
}

bool has_test(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(Renderer& r, std::string_view name, const Value& subject, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw ValueError("no test named '" + std::string(name) + "'");
  r.step();
  return it->second(r, subject, args);
}

}  // namespace m3::text::tmpl
