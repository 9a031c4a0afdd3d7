// MiniMax-M3 tool-call XML to OpenAI tool_calls (serve/tool_calls.h).
#include "serve/tool_calls.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "serve/text_stream.h"

namespace m3::serve {

using nlohmann::json;

namespace {

const std::string kOpen = std::string(kToolNs) + "<";     // an element's opening tag starts so
const std::string kClose = std::string(kToolNs) + "</";   // and its closing tag so
const std::string kBlockOpen = std::string(kToolNs) + "<tool_call>";
const std::string kBlockClose = std::string(kToolNs) + "</tool_call>";
const std::string kInvokeClose = std::string(kToolNs) + "</invoke>";
constexpr int kMaxDepth = 32;

struct Node {
  std::string tag;
  bool leaf = true;
  std::string text;
  std::vector<Node> kids;
};

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  return i;
}
bool at(std::string_view s, size_t i, std::string_view w) { return s.substr(i).starts_with(w); }
std::string_view trim(std::string_view t) {
  const size_t a = skip_ws(t, 0);
  size_t b = t.size();
  while (b > a && (t[b - 1] == ' ' || t[b - 1] == '\n' || t[b - 1] == '\r' || t[b - 1] == '\t')) --b;
  return t.substr(a, b - a);
}

// One element at s[i..] (after optional whitespace): NS<tag> then text or child elements, then
// NS</tag>. Text holds no NS.
bool parse_element(std::string_view s, size_t& i, Node& n, int depth) {
  if (depth > kMaxDepth) return false;
  i = skip_ws(s, i);
  if (!at(s, i, kOpen) || at(s, i, kClose)) return false;
  i += kOpen.size();
  const size_t gt = s.find('>', i);
  if (gt == std::string_view::npos || gt == i) return false;
  n.tag = std::string(s.substr(i, gt - i));
  if (n.tag.find_first_of("<]\n") != std::string::npos) return false;
  i = gt + 1;
  const std::string close = kClose + n.tag + ">";
  const size_t j = skip_ws(s, i);
  if (at(s, j, kOpen) && !at(s, j, kClose)) {
    n.leaf = false;
    i = j;
    for (;;) {
      const size_t k = skip_ws(s, i);
      if (at(s, k, close)) {
        i = k + close.size();
        return true;
      }
      Node c;
      if (!parse_element(s, i, c, depth + 1)) return false;
      n.kids.push_back(std::move(c));
    }
  }
  const size_t p = s.find(close, i);
  if (p == std::string_view::npos || s.find(kToolNs, i) != p) return false;
  n.text = std::string(s.substr(i, p - i));
  i = p + close.size();
  return true;
}

// The schema's type ("" when none or not a string) and whether it admits null.
std::string schema_type(const json* schema, bool* nullable) {
  *nullable = false;
  if (!schema || !schema->is_object()) return "";
  const auto t = schema->find("type");
  if (t == schema->end()) return "";
  if (t->is_string()) {
    *nullable = t->get<std::string>() == "null";
    return t->get<std::string>();
  }
  std::string first;
  if (t->is_array())
    for (const auto& e : *t)
      if (e.is_string()) {
        if (e.get<std::string>() == "null") *nullable = true;
        else if (first.empty()) first = e.get<std::string>();
      }
  return first;
}

const json* sub_schema(const json* schema, const char* key, const std::string& name = "") {
  if (!schema || !schema->is_object()) return nullptr;
  const auto f = schema->find(key);
  if (f == schema->end()) return nullptr;
  if (name.empty()) return &*f;
  if (!f->is_object()) return nullptr;
  const auto g = f->find(name);
  return g == f->end() ? nullptr : &*g;
}

json typed(const Node& n, const json* schema) {
  bool nullable = false;
  const std::string type = schema_type(schema, &nullable);
  if (!n.leaf) {
    bool items = true;
    for (const auto& k : n.kids) items = items && k.tag == "item";
    if (type == "array" || (type.empty() && items)) {
      json a = json::array();
      for (const auto& k : n.kids) a.push_back(typed(k, sub_schema(schema, "items")));
      return a;
    }
    json o = json::object();
    for (const auto& k : n.kids) o[k.tag] = typed(k, sub_schema(schema, "properties", k.tag));
    return o;
  }
  const std::string t(trim(n.text));
  if ((nullable || type == "null") && t == "null") return nullptr;
  if (type == "integer") {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && errno == 0 && end == t.c_str() + t.size()) return v;
  } else if (type == "number") {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (!t.empty() && errno == 0 && end == t.c_str() + t.size() && std::isfinite(v)) return v;
  } else if (type == "boolean") {
    if (t == "true" || t == "false") return t == "true";
  } else if (type == "object" || type == "array") {
    json v = json::parse(t, nullptr, false);
    if (!v.is_discarded() && (type == "object" ? v.is_object() : v.is_array())) return v;
  }
  return n.text;
}

}  // namespace

bool parse_invoke(std::string_view s, const std::map<std::string, json>& schemas, ToolCall* out) {
  static const std::string head = std::string(kToolNs) + "<invoke name=\"";
  size_t i = skip_ws(s, 0);
  if (!at(s, i, head)) return false;
  i += head.size();
  const size_t q = s.find("\">", i);
  if (q == std::string_view::npos || q == i) return false;
  const std::string name(s.substr(i, q - i));
  if (name.find_first_of("\"<>\n") != std::string::npos || name.find(kToolNs) != std::string::npos) return false;
  i = q + 2;
  const auto f = schemas.find(name);
  const json* params = f == schemas.end() ? nullptr : &f->second;
  json args = json::object();
  while (skip_ws(s, i) < s.size()) {
    Node n;
    if (!parse_element(s, i, n, 0)) return false;
    args[n.tag] = typed(n, sub_schema(params, "properties", n.tag));
  }
  out->name = name;
  out->arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

ToolCallParser::ToolCallParser(const json& tools) {
  if (!tools.is_array()) return;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const json& fn = t.contains("function") && t["function"].is_object() ? t["function"] : t;
    if (!fn.contains("name") || !fn["name"].is_string()) continue;
    schemas_[fn["name"].get<std::string>()] = fn.contains("parameters") ? fn["parameters"] : json(nullptr);
  }
}

ToolCallParser::Out ToolCallParser::push(std::string_view text, bool last) {
  held_ += text;
  return release(last);
}

ToolCallParser::Out ToolCallParser::release(bool final) {
  static const std::vector<std::string> opener{kBlockOpen};
  Out o;
  for (;;) {
    if (!in_block_) {
      const size_t p = held_.find(kBlockOpen);
      if (p != std::string::npos) {
        o.content += held_.substr(0, p);
        held_.erase(0, p + kBlockOpen.size());
        in_block_ = true;
        calls_in_block_ = 0;
        continue;
      }
      const size_t keep = final ? 0 : held_back_length(held_, opener);
      o.content += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return o;
    }
    const size_t e = held_.find(kBlockClose), q = held_.find(kInvokeClose);
    if (e != std::string::npos && (q == std::string::npos || e < q)) {
      // the block ends; anything but whitespace left in it is text the model wrote
      const std::string_view rest = trim(std::string_view(held_).substr(0, e));
      if (!rest.empty()) o.content += std::string(rest);
      held_.erase(0, e + kBlockClose.size());
      in_block_ = false;
      continue;
    }
    if (q != std::string::npos) {
      ToolCall c;
      if (parse_invoke(std::string_view(held_).substr(0, q), schemas_, &c)) {
        o.calls.push_back(std::move(c));
        ++calls_in_block_;
      } else {
        o.content += held_.substr(0, q + kInvokeClose.size());  // as written
      }
      held_.erase(0, q + kInvokeClose.size());
      continue;
    }
    if (final) {  // the block never closed: what is left of it is text
      if (!trim(held_).empty()) o.content += (calls_in_block_ == 0 ? kBlockOpen : std::string()) + held_;
      held_.clear();
      in_block_ = false;
    }
    return o;
  }
}

}  // namespace m3::serve
