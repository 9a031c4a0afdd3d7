// quantization_config -> QuantConfig (model/quant_config.h).
#include "model/quant_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "model/json_brief.h"

namespace m3 {

using json = nlohmann::json;

std::string_view weight_quant_name(WeightQuant q) {
  switch (q) {
    case WeightQuant::Float: return "float";
    case WeightQuant::Mxfp8: return "mxfp8";
    case WeightQuant::Mxfp4: return "mxfp4";
    case WeightQuant::Fp8Tensor: return "fp8 per-tensor";
  }
  return "?";
}

std::string_view quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::None: return "none";
    case QuantMethod::Mxfp8: return "mxfp8";
    case QuantMethod::Quark: return "quark";
  }
  return "?";
}

namespace {

constexpr size_t kMaxPattern = 512;   // longer patterns are refused (they are names, not programs)
constexpr size_t kMaxPatterns = 4096;

// Glob over the whole name: * any run (dots included, as fnmatch), ? one character. Iterative with
// one backtrack point: linear in |name| x |pattern| at worst.
bool glob_match(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool ends_with_component(std::string_view name, std::string_view tail) {
  if (tail.empty() || name.size() < tail.size()) return false;
  if (name == tail) return true;
  return name.size() > tail.size() && name.substr(name.size() - tail.size()) == tail &&
         name[name.size() - tail.size() - 1] == '.';
}

std::string show(const json& j) { return json_brief(j); }

void check_pattern(const std::string& p, const std::string& field, const std::string& origin) {
  M3_CHECK(!p.empty(), "{}: {} holds an empty pattern", origin, field);
  M3_CHECK(p.size() <= kMaxPattern, "{}: {} holds a pattern of {} characters (at most {})", origin, field, p.size(),
           kMaxPattern);
  // Regular expressions ("re:", as compressed-tensors configs write them) are refused rather than
  // run: a backtracking matcher on an untrusted pattern can take exponential time, and the released
  // Quark and MXFP8 configs list names and globs.
  M3_CHECK(p.rfind("re:", 0) != 0, "{}: {} holds '{}': regular-expression patterns are not supported (list module "
           "names or globs with * and ?)", origin, field, p);
}

std::vector<std::string> pattern_list(const json& q, const char* key, const std::string& origin) {
  std::vector<std::string> out;
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return out;
  const std::string field = fmt::format("quantization_config.{}", key);
  M3_CHECK(it->is_array(), "{}: {} must be a list of module names or patterns, got {}", origin, field, show(*it));
  M3_CHECK(it->size() <= kMaxPatterns, "{}: {} holds {} patterns (at most {})", origin, field, it->size(),
           kMaxPatterns);
  for (const auto& v : *it) {
    M3_CHECK(v.is_string(), "{}: {} must hold strings, got {}", origin, field, show(v));
    out.push_back(v.get<std::string>());
    check_pattern(out.back(), field, origin);
  }
  return out;
}

// A Quark weight spec {"dtype", "qscheme", "group_size", "scale_format", ...} -> its format.
WeightQuant quark_weight(const json& spec, const std::string& field, const std::string& origin) {
  if (spec.is_null()) return WeightQuant::Float;
  M3_CHECK(spec.is_object(), "{}: {} must be an object, got {}", origin, field, show(spec));
  auto str = [&](const char* k) -> std::string {
    auto it = spec.find(k);
    if (it == spec.end() || it->is_null()) return "";
    M3_CHECK(it->is_string(), "{}: {}.{} must be a string, got {}", origin, field, k, show(*it));
    return it->get<std::string>();
  };
  const std::string dtype = str("dtype"), qscheme = str("qscheme"), scale = str("scale_format");
  int group = 0;
  if (auto it = spec.find("group_size"); it != spec.end() && !it->is_null()) {
    M3_CHECK(it->is_number_integer(), "{}: {}.group_size must be an integer, got {}", origin, field, show(*it));
    group = int(std::clamp<int64_t>(it->get<int64_t>(), -1, 1 << 20));
  }
  auto need_mx = [&](const char* what) {
    M3_CHECK(qscheme == "per_group" && group == 32, "{}: {} is {} with qscheme '{}' and group_size {}; this engine "
             "reads {} only per_group with group_size 32", origin, field, dtype, qscheme, group, what);
    M3_CHECK(scale.empty() || scale == "e8m0", "{}: {}.scale_format is '{}'; MX scales are e8m0", origin, field, scale);
  };
  if (dtype == "fp4" || dtype == "fp4_e2m1" || dtype == "mxfp4") {
    need_mx("fp4");
    return WeightQuant::Mxfp4;
  }
  if (dtype == "fp8_e4m3" || dtype == "fp8" || dtype == "mxfp8") {
    if (qscheme == "per_tensor") return WeightQuant::Fp8Tensor;
    need_mx("fp8_e4m3");
    return WeightQuant::Mxfp8;
  }
  M3_FAIL("{}: {}.dtype is '{}'; this engine reads fp4 (MXFP4) and fp8_e4m3 (per-tensor or MXFP8) weights", origin,
          field, dtype.empty() ? show(spec) : dtype);
}

// The keys of layer_quant_config in the order the file writes them (`sorted`: the same object as
// parsed into a sorted json; its keys are returned in file order).
std::vector<std::string> file_order_keys(const std::string& text, const json& sorted) {
  std::vector<std::string> keys;
  const nlohmann::ordered_json root = nlohmann::ordered_json::parse(text);
  const nlohmann::ordered_json* q = nullptr;
  for (const nlohmann::ordered_json* obj :
       {&root, root.contains("text_config") ? &root["text_config"] : nullptr}) {
    if (!obj || !obj->is_object()) continue;
    auto it = obj->find("quantization_config");
    if (it != obj->end() && !it->is_null()) {
      q = &*it;
      break;
    }
  }
  if (q && q->is_object()) {
    auto l = q->find("layer_quant_config");
    if (l != q->end() && l->is_object())
      for (auto it = l->begin(); it != l->end(); ++it)
        if (sorted.contains(it.key()) &&
            std::find(keys.begin(), keys.end(), it.key()) == keys.end())
          keys.push_back(it.key());
  }
  for (auto it = sorted.begin(); it != sorted.end(); ++it)  // (both parses see the same keys)
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
  return keys;
}

}  // namespace

bool quant_pattern_matches(std::string_view pattern, std::string_view module) {
  if (pattern.find_first_of("*?") != std::string_view::npos) return glob_match(pattern, module);
  return ends_with_component(module, pattern);
}

WeightQuant QuantConfig::expected(std::string_view module, std::string* why) const {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
  };
  if (method == QuantMethod::None) {
    say("no quantization_config");
    return WeightQuant::Float;
  }
  for (const auto& p : exclude)
    if (quant_pattern_matches(p, module)) {
      say(fmt::format("excluded by '{}'", p));
      return WeightQuant::Float;
    }
  for (const auto& r : layers)
    if (quant_pattern_matches(r.pattern, module)) {
      say(fmt::format("layer_quant_config '{}'", r.pattern));
      return r.quant;
    }
  say(method == QuantMethod::Quark ? "global_quant_config" : std::string(quant_method_name(method)));
  return global;
}

std::string QuantConfig::describe() const {
  if (method == QuantMethod::None) return "none";
  return fmt::format("{}: {} for linears, {} layer rule(s), {} exclusion(s)", quant_method_name(method),
                     weight_quant_name(global), layers.size(), exclude.size());
}

QuantConfig parse_quant_config(const std::string& json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    M3_FAIL("{}: invalid JSON: {}", origin, e.what());
  }
  QuantConfig c;
  c.origin = origin;
  if (!root.is_object()) return c;  // parse_model_spec_json names that problem
  const json* q = nullptr;
  for (const json* obj : {&root, root.contains("text_config") ? &root["text_config"] : nullptr}) {
    if (!obj || !obj->is_object()) continue;
    auto it = obj->find("quantization_config");
    if (it != obj->end() && !it->is_null()) {
      q = &*it;
      break;
    }
  }
  if (!q) return c;
  M3_CHECK(q->is_object(), "{}: quantization_config must be an object, got {}", origin, show(*q));
  auto mit = q->find("quant_method");
  M3_CHECK(mit != q->end() && mit->is_string(), "{}: quantization_config.quant_method must be a string, got {}",
           origin, mit == q->end() ? std::string("nothing") : show(*mit));
  const std::string method = mit->get<std::string>();
  if (method == "mxfp8") {
    c.method = QuantMethod::Mxfp8;
    c.global = WeightQuant::Mxfp8;
    if (auto it = q->find("weight_block_size"); it != q->end() && !it->is_null()) {
      M3_CHECK(*it == json::array({1, 32}), "{}: quantization_config.weight_block_size is {}; MXFP8 is [1, 32]",
               origin, show(*it));
    }
    for (const char* k : {"modules_to_not_convert", "ignored_layers", "exclude"})
      for (auto& p : pattern_list(*q, k, origin)) c.exclude.push_back(std::move(p));
    return c;
  }
  if (method == "quark") {
    c.method = QuantMethod::Quark;
    auto g = q->find("global_quant_config");
    M3_CHECK(g != q->end() && g->is_object(), "{}: quantization_config.global_quant_config must be an object, got {}",
             origin, g == q->end() ? std::string("nothing") : show(*g));
    auto gw = g->find("weight");
    c.global = quark_weight(gw == g->end() ? json() : *gw, "quantization_config.global_quant_config.weight", origin);
    if (auto l = q->find("layer_quant_config"); l != q->end() && !l->is_null()) {
      M3_CHECK(l->is_object(), "{}: quantization_config.layer_quant_config must be an object, got {}", origin,
               show(*l));
      M3_CHECK(l->size() <= kMaxPatterns, "{}: quantization_config.layer_quant_config holds {} rules (at most {})",
               origin, l->size(), kMaxPatterns);
      // the rules in the file's order (the first that matches wins, as vLLM reads Quark configs):
      // nlohmann::json keeps object keys sorted, so the order comes from an order-keeping parse
      for (const std::string& key : file_order_keys(json_text, *l)) {
        const json& rule = l->at(key);
        const std::string field = fmt::format("quantization_config.layer_quant_config['{}']", key);
        check_pattern(key, "quantization_config.layer_quant_config", origin);
        M3_CHECK(rule.is_object(), "{}: {} must be an object, got {}", origin, field, show(rule));
        auto w = rule.find("weight");
        c.layers.push_back({key, quark_weight(w == rule.end() ? json() : *w, field + ".weight", origin)});
      }
    }
    c.exclude = pattern_list(*q, "exclude", origin);
    return c;
  }
  M3_FAIL("{}: quantization_config.quant_method '{}' is not one this engine reads (mxfp8, quark)", origin, method);
}

QuantConfig load_quant_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_quant_config(ss.str(), path.string());
}

}  // namespace m3
