// Methods of str / dict / list values and the template globals (range, namespace, dict,
// raise_exception, strftime_now), with Python's semantics.
#include <ctime>

#include "text/template_builtins.h"
#include "text/template_error.h"
#include "text/template_render.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {

std::string str_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  if (count == 0) return s;
  std::string out;
  if (old.empty()) {
    // Python inserts rep before every character and at the end.
    std::u32string u = utf8_decode(s);
    int64_t done = 0;
    for (char32_t c : u) {
      if (count < 0 || done < count) { out += rep; ++done; }
      utf8_append(out, c);
    }
    if (count < 0 || done < count) out += rep;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (true) {
    size_t f = s.find(old, pos);
    if (f == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, pos, f - pos);
    out += rep;
    pos = f + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string u = utf8_decode(s);
    size_t i = 0;
    int64_t splits = 0;
    while (true) {
      while (i < u.size() && py_isspace(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        size_t e = u.size();
        while (e > i && py_isspace(u[e - 1])) --e;
        out.emplace_back(utf8_encode(std::u32string_view(u).substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !py_isspace(u[j])) ++j;
      out.emplace_back(utf8_encode(std::u32string_view(u).substr(i, j - i)));
      ++splits;
      i = j;
    }
    return out;
  }
  if (!sep.is_string()) throw ValueError("must be str or None, not " + type_name(sep));
  const std::string& d = sep.str();
  if (d.empty()) throw ValueError("empty separator");
  size_t pos = 0;
  int64_t splits = 0;
  while (true) {
    size_t f = s.find(d, pos);
    if (f == std::string::npos || (maxsplit >= 0 && splits >= maxsplit)) break;
    out.emplace_back(s.substr(pos, f - pos));
    pos = f + d.size();
    ++splits;
  }
  out.emplace_back(s.substr(pos));
  return out;
}

namespace {

using Method = std::function<Value(const Value& self, CallArgs&, Renderer&)>;

Value bind(const Value& self, const std::string& name, Method m) {
  return Value::callable(name, [self, m](CallArgs& a, Renderer& r) { return m(self, a, r); });
}

std::string need_str(const Value& v, const char* what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) fail_undefined(v);
  throw ValueError(std::string(what) + " must be str, not " + type_name(v));
}

// Python's str.title(): a cased character after an uncased one is upper-cased, others lowered.
std::string py_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    bool cased = py_iscased_upper(c) || py_iscased_lower(c);
    c = prev_cased ? py_lower(c) : py_upper(c);
    prev_cased = cased;
  }
  return utf8_encode(u);
}

bool affix_match(const std::string& s, const Value& arg, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.is_list() && arg.list_ptr()->tuple) {
    for (const Value& x : arg.list_ptr()->items)
      if (one(need_str(x, "tuple item"))) return true;
    return false;
  }
  return one(need_str(arg, prefix ? "startswith arg" : "endswith arg"));
}

std::optional<Value> str_method(const Value& self, const std::string& name) {
  auto m = [&](Method f) { return bind(self, name, std::move(f)); };
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return m([prefix, name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      Value arg = ar.get(0, "prefix", Value::undefined(name + "() takes at least 1 argument (0 given)"));
      Value start = ar.get(1, "start", Value(nullptr));
      Value end = ar.get(2, "end", Value(nullptr));
      ar.done(3);
      Value sub = (start.is_none() && end.is_none()) ? s : slice(s, start, end, Value(nullptr));
      return Value(affix_match(sub.str(), arg, prefix));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return m([l, r, name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      Value chars = ar.get(0, "chars", Value(nullptr));
      ar.done(1);
      std::string cs = chars.is_none() ? "" : need_str(chars, "chars");
      return Value(py_strip(s.str(), l, r, chars.is_none() ? nullptr : &cs));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool rsplit = name == "rsplit";
    return m([rsplit, name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      Value sep = ar.get(0, "sep", Value(nullptr));
      int64_t maxsplit = to_index(ar.get(1, "maxsplit", Value(-1)), "maxsplit");
      ar.done(2);
      if (rsplit && maxsplit >= 0) throw ValueError("unsupported: rsplit with maxsplit");
      return Value::list(py_split(s.str(), sep, maxsplit));
    });
  }
  if (name == "splitlines") {
    return m([](const Value& s, CallArgs& a, Renderer&) {
      ArgReader(a, "splitlines").done(0);
      std::vector<Value> out;
      std::string cur;
      const std::string& t = s.str();
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] == '\n' || t[i] == '\r') {
          if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
          out.emplace_back(cur);
          cur.clear();
        } else {
          cur.push_back(t[i]);
        }
      }
      if (!cur.empty()) out.emplace_back(cur);
      return Value::list(std::move(out));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    return m([name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader(a, name).done(0);
      if (name == "upper") return Value(str_upper(s.str()));
      if (name == "lower") return Value(str_lower(s.str()));
      if (name == "title") return Value(py_title(s.str()));
      std::u32string u = utf8_decode(s.str());
      for (size_t i = 0; i < u.size(); ++i) {
        if (name == "capitalize") u[i] = i == 0 ? py_upper(u[i]) : py_lower(u[i]);
        else u[i] = py_iscased_upper(u[i]) ? py_lower(u[i]) : py_upper(u[i]);
      }
      return Value(utf8_encode(u));
    });
  }
  if (name == "replace") {
    return m([](const Value& s, CallArgs& a, Renderer& r) {
      ArgReader ar(a, "replace");
      std::string old = need_str(ar.get(0, "old", Value::undefined("replace() missing argument 'old'")), "old");
      std::string rep = need_str(ar.get(1, "new", Value::undefined("replace() missing argument 'new'")), "new");
      int64_t count = to_index(ar.get(2, "count", Value(-1)), "count");
      ar.done(3);
      std::string out = str_replace(s.str(), old, rep, count);
      r.check_size(out.size());
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex") {
    return m([name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      std::string sub = need_str(ar.get(0, "sub", Value::undefined(name + "() missing argument")), "sub");
      ar.done(1);
      const std::string& t = s.str();
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(t) + 1));
        int64_t n = 0;
        for (size_t p = t.find(sub); p != std::string::npos; p = t.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      size_t p = (name == "find" || name == "index") ? t.find(sub) : t.rfind(sub);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") throw ValueError("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(utf8_length(std::string_view(t).substr(0, p))));
    });
  }
  if (name == "join") {
    return m([](const Value& s, CallArgs& a, Renderer& r) {
      ArgReader ar(a, "join");
      Value seq = ar.get(0, "iterable", Value::undefined("join() takes exactly one argument (0 given)"));
      ar.done(1);
      std::string out;
      bool first = true;
      for (const Value& x : iterate(seq)) {
        if (!x.is_string()) throw ValueError("sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s.str();
        first = false;
        out += x.str();
        r.check_size(out.size());
      }
      return Value(std::move(out));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return m([prefix, name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      std::string x = need_str(ar.get(0, "prefix", Value::undefined(name + "() missing argument")), "argument");
      ar.done(1);
      const std::string& t = s.str();
      if (prefix && t.compare(0, x.size(), x) == 0 && x.size() <= t.size()) return Value(t.substr(x.size()));
      if (!prefix && x.size() <= t.size() && t.compare(t.size() - x.size(), x.size(), x) == 0)
        return Value(t.substr(0, t.size() - x.size()));
      return s;
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "isupper" ||
      name == "islower") {
    return m([name](const Value& s, CallArgs& a, Renderer&) {
      ArgReader(a, name).done(0);
      std::u32string u = utf8_decode(s.str());
      if (u.empty()) return Value(false);
      if (name == "isupper" || name == "islower") {
        bool any_cased = false;
        for (char32_t c : u) {
          if (name == "isupper" ? py_iscased_lower(c) && !py_iscased_upper(c) : py_iscased_upper(c)) return Value(false);
          if (py_iscased_upper(c) || py_iscased_lower(c)) any_cased = true;
        }
        return Value(any_cased);
      }
      for (char32_t c : u) {
        bool ok = name == "isdigit" ? py_isdigit(c)
                : name == "isalpha" ? py_isalpha(c)
                : name == "isspace" ? py_isspace(c)
                                    : (py_isalpha(c) || py_isdigit(c));
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  auto m = [&](Method f) { return bind(self, name, std::move(f)); };
  if (name == "items") {
    return m([](const Value& d, CallArgs& a, Renderer&) {
      ArgReader(a, "items").done(0);
      std::vector<Value> out;
      for (const auto& [k, v] : d.dict_ptr()->items) out.push_back(Value::list({Value(k), v}, true));
      return Value::list(std::move(out));
    });
  }
  if (name == "keys") {
    return m([](const Value& d, CallArgs& a, Renderer&) {
      ArgReader(a, "keys").done(0);
      return Value::list(iterate(d));
    });
  }
  if (name == "values") {
    return m([](const Value& d, CallArgs& a, Renderer&) {
      ArgReader(a, "values").done(0);
      std::vector<Value> out;
      for (const auto& kv : d.dict_ptr()->items) out.push_back(kv.second);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return m([](const Value& d, CallArgs& a, Renderer&) {
      if (!a.kw.empty()) throw ValueError("get() takes no keyword arguments");
      if (a.pos.empty() || a.pos.size() > 2) throw ValueError("get expected 1 or 2 arguments");
      if (a.pos[0].is_string())
        if (const Value* v = d.dict_ptr()->find(a.pos[0].str())) return *v;
      return a.pos.size() == 2 ? a.pos[1] : Value(nullptr);
    });
  }
  if (name == "copy") {
    return m([](const Value& d, CallArgs& a, Renderer&) {
      ArgReader(a, "copy").done(0);
      return Value(std::make_shared<DictData>(*d.dict_ptr()));
    });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
    return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  return std::nullopt;
}

std::optional<Value> list_method(const Value& self, const std::string& name) {
  auto m = [&](Method f) { return bind(self, name, std::move(f)); };
  if (name == "index" || name == "count") {
    return m([name](const Value& l, CallArgs& a, Renderer&) {
      ArgReader ar(a, name);
      Value x = ar.get(0, "value", Value::undefined(name + "() takes exactly one argument (0 given)"));
      ar.done(1);
      int64_t n = 0;
      const auto& items = l.list_ptr()->items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!equals(items[i], x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") throw ValueError(repr(x) + " is not in list");
      return Value(n);
    });
  }
  if (!self.list_ptr()->tuple &&
      (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
       name == "clear" || name == "sort" || name == "reverse"))
    return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
  return std::nullopt;
}

Value make_namespace(CallArgs& a, Renderer& r) {
  auto ns = std::make_shared<NamespaceData>();
  ns->attrs = std::make_shared<DictData>();
  r.track_namespace(ns);
  if (a.pos.size() > 1) throw ValueError("namespace() takes at most one positional argument");
  if (!a.pos.empty()) {
    if (!a.pos[0].is_dict()) throw ValueError("namespace() positional argument must be a dict");
    *ns->attrs = *a.pos[0].dict_ptr();
  }
  for (auto& [k, v] : a.kw) {
    if (!k.empty() && k[0] == '_') throw ValueError("chat templates cannot store underscore-prefixed attributes on a namespace");
    ns->attrs->set(k, v);
  }
  return Value(std::move(ns));
}

Value make_range(CallArgs& a, Renderer& r) {
  if (!a.kw.empty()) throw ValueError("range() takes no keyword arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) stop = to_index(a.pos[0], "range() argument");
  else if (a.pos.size() == 2 || a.pos.size() == 3) {
    start = to_index(a.pos[0], "range() argument");
    stop = to_index(a.pos[1], "range() argument");
    if (a.pos.size() == 3) step = to_index(a.pos[2], "range() argument");
  } else {
    throw ValueError("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
  }
  if (step == 0) throw ValueError("range() arg 3 must not be zero");
  // jinja2's sandbox caps ranges at 100000 items.
  __int128 n = step > 0 ? (stop > start ? ((__int128)stop - start + step - 1) / step : 0)
                        : (start > stop ? ((__int128)start - stop - step - 1) / (-step) : 0);
  if (n > 100000) throw ValueError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) items.emplace_back(start + i * step);
  r.step();
  return Value::list(std::move(items));
}

}  // namespace

std::optional<Value> get_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::String: return str_method(obj, name);
    case Value::Kind::Dict: return dict_method(obj, name);
    case Value::Kind::List: return list_method(obj, name);
    default: return std::nullopt;
  }
}

std::optional<Value> get_global(std::string_view name) {
  if (name == "range") return Value::callable("range", make_range);
  if (name == "namespace") return Value::callable("namespace", make_namespace);
  if (name == "dict") {
    return Value::callable("dict", [](CallArgs& a, Renderer&) {
      auto d = std::make_shared<DictData>();
      if (a.pos.size() > 1) throw ValueError("dict expected at most 1 argument");
      if (!a.pos.empty()) {
        if (!a.pos[0].is_dict()) throw ValueError("unsupported: dict() from a non-dict");
        *d = *a.pos[0].dict_ptr();
      }
      for (auto& [k, v] : a.kw) d->set(k, v);
      return Value(std::move(d));
    });
  }
  if (name == "raise_exception") {
    return Value::callable("raise_exception", [](CallArgs& a, Renderer&) -> Value {
      std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
      throw ValueError(msg, true);
    });
  }
  if (name == "strftime_now") {
    return Value::callable("strftime_now", [](CallArgs& a, Renderer&) -> Value {
      if (a.pos.size() != 1 || !a.pos[0].is_string()) throw ValueError("strftime_now(format) takes one string");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }
  return std::nullopt;
}

}  // namespace m3::text::tmpl
