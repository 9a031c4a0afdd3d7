#include "text/template_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/template_error.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {

template <typename J>
static Value convert(const J& j, int depth) {
  if (depth > 512) throw ValueError("render context nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value(nullptr);
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<DictData>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(it.key(), convert(it.value(), depth + 1));
      return Value(std::move(d));
    }
    default: throw ValueError("render context holds a JSON value of unsupported type (binary)");
  }
}

Value from_json(const nlohmann::ordered_json& j) { return convert(j, 0); }
Value from_json(const nlohmann::json& j) { return convert(j, 0); }

static void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  auto hex4 = [&](unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", v & 0xFFFFu);
    out += b;
  };
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      hex4(c);
    } else if (ensure_ascii && c >= 0x7F) {
      if (c < 0x10000) {
        hex4(c);
      } else {
        char32_t v = c - 0x10000;
        hex4(0xD800 + (v >> 10));
        hex4(0xDC00 + (v & 0x3FF));
      }
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back('"');
}

static void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  auto newline = [&](int lv) {
    if (!o.indent) return;
    out.push_back('\n');
    for (int i = 0; i < lv; ++i) out += *o.indent;
  };
  const std::string& item_sep = *o.item_separator;
  if (level > 512) throw ValueError("tojson: value nested too deeply");
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(d);
      return;
    }
    case Value::Kind::String: dump_string(out, v.str(), o.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.list_ptr()->items;
      if (items.empty()) { out += "[]"; return; }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        dump(out, items[i], o, level + 1);
        check_print_size(out.size());
      }
      newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      const auto& items = v.dict_ptr()->items;
      if (items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& kv : items) order.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : order) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        dump_string(out, kv->first, o.ensure_ascii);
        out += o.key_separator;
        dump(out, kv->second, o, level + 1);
        check_print_size(out.size());
      }
      newline(level);
      out.push_back('}');
      return;
    }
    default:
      throw ValueError("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string dumps(const Value& v, const JsonDumpOptions& options) {
  JsonDumpOptions o = options;
  if (!o.item_separator) o.item_separator = o.indent ? "," : ", ";
  std::string out;
  dump(out, v, o, 0);
  return out;
}

}  // namespace m3::text::tmpl
