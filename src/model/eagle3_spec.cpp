// config.json of an EAGLE3 draft (model/eagle3_spec.h).
#include "model/eagle3_spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>

#include <fmt/format.h>

#include "core/check.h"
#include "model/json_brief.h"

namespace m3 {

using json = nlohmann::json;

namespace {

struct Reader {
  const json& j;
  std::string file;
  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int integer(const char* key, int def, bool required = false) const {
    const json* v = get(key);
    M3_CHECK(v || !required, "{}: required field '{}' is missing", file, key);
    if (!v) return def;
    M3_CHECK(v->is_number_integer() && v->get<int64_t>() > 0 && v->get<int64_t>() <= (int64_t(1) << 30),
             "{}: field '{}' must be a positive integer, got {}", file, key, json_brief(*v));
    return int(v->get<int64_t>());
  }
  double number(const char* key, double def) const {
    const json* v = get(key);
    if (!v) return def;
    M3_CHECK(v->is_number() && std::isfinite(v->get<double>()) && v->get<double>() > 0,
             "{}: field '{}' must be a positive number, got {}", file, key, json_brief(*v));
    return v->get<double>();
  }
  bool flag(const char* key) const {
    const json* v = get(key);
    if (!v) return false;
    M3_CHECK(v->is_boolean(), "{}: field '{}' must be true or false, got {}", file, key, json_brief(*v));
    return v->get<bool>();
  }
};

}  // namespace

std::vector<int> eagle3_default_aux_layers(int L) {
  if (L >= 6) return {2, L / 2, L - 3};
  std::vector<int> v;  // small (test) targets: up to three distinct consecutive layers ending near the top
  for (int l = std::max(0, L - 3); l <= L && v.size() < 3; ++l) v.push_back(l);
  return v;
}

Eagle3Spec load_eagle3_spec(const std::filesystem::path& path, const ModelSpec& target) {
  const std::filesystem::path file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  M3_CHECK(in.good(), "EAGLE3 draft: cannot read {} (a draft checkpoint directory holds config.json and "
           "model.safetensors)", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const std::exception& e) {
    M3_FAIL("EAGLE3 draft: {} is not valid JSON: {}", file.string(), e.what());
  }
  M3_CHECK(j.is_object(), "EAGLE3 draft: {} holds {}, not an object", file.string(), json_brief(j));
  const Reader r{j, file.string()};
  if (const json* a = r.get("architectures")) {
    M3_CHECK(a->is_array(), "{}: field 'architectures' must be a list, got {}", r.file, json_brief(*a));
    bool ok = false;
    for (const json& x : *a)
      ok = ok || (x.is_string() && (x == "LlamaForCausalLMEagle3" || x == "Eagle3LlamaForCausalLM"));
    M3_CHECK(ok, "{}: architectures {} is not an EAGLE3 Llama draft (LlamaForCausalLMEagle3)", r.file, json_brief(*a));
  }
  Eagle3Spec s;
  const int layers = r.integer("num_hidden_layers", 1);
  M3_CHECK(layers == 1, "{}: num_hidden_layers {}: only one-layer EAGLE3 drafts are supported", r.file, layers);
  s.hidden = r.integer("hidden_size", 0, true);
  s.target_hidden = r.integer("target_hidden_size", s.hidden);
  s.num_heads = r.integer("num_attention_heads", 0, true);
  s.num_kv_heads = r.integer("num_key_value_heads", s.num_heads);
  s.head_dim = r.integer("head_dim", s.hidden / s.num_heads);
  s.intermediate = r.integer("intermediate_size", 0, true);
  s.vocab = r.integer("vocab_size", target.vocab_size);
  s.draft_vocab = r.integer("draft_vocab_size", s.vocab);
  s.rms_eps = float(r.number("rms_norm_eps", 1e-6));
  s.rope_theta = r.number("rope_theta", 10000);
  s.norm_before_residual = r.flag("norm_before_residual");
  M3_CHECK(!r.flag("attention_bias") && !r.flag("mlp_bias") && !r.flag("qkv_bias"),
           "{}: attention or MLP biases are not supported in an EAGLE3 draft", r.file);
  if (const json* act = r.get("hidden_act"))
    M3_CHECK(*act == "silu", "{}: hidden_act {} (only silu)", r.file, json_brief(*act));
  if (const json* rs = r.get("rope_scaling")) {
    M3_CHECK(rs->is_object(), "{}: rope_scaling must be an object, got {}", r.file, json_brief(*rs));
    const Reader q{*rs, r.file + " rope_scaling"};
    const json* t = q.get("rope_type") ? q.get("rope_type") : q.get("type");
    const std::string type = t && t->is_string() ? t->get<std::string>() : "";
    if (type == "llama3") {
      s.rope_factor = q.number("factor", 8);
      s.rope_low_freq = q.number("low_freq_factor", 1);
      s.rope_high_freq = q.number("high_freq_factor", 4);
      s.rope_original_max = q.integer("original_max_position_embeddings", 8192);
      M3_CHECK(s.rope_high_freq > s.rope_low_freq, "{}: high_freq_factor {} must exceed low_freq_factor {}", q.file,
               s.rope_high_freq, s.rope_low_freq);
    } else {
      M3_CHECK(type == "default" || type.empty() && !t, "{}: rope_scaling type {} is not supported (default, llama3)",
               r.file, t ? json_brief(*t) : std::string("(none)"));
    }
  }
  s.aux_layers = eagle3_default_aux_layers(target.num_layers);
  if (const json* ec = r.get("eagle_config")) {
    M3_CHECK(ec->is_object(), "{}: eagle_config must be an object, got {}", r.file, json_brief(*ec));
    auto it = ec->find("eagle_aux_hidden_state_layer_ids");
    if (it != ec->end() && !it->is_null()) {
      M3_CHECK(it->is_array() && !it->empty(), "{}: eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty "
               "list of layer ids, got {}", r.file, json_brief(*it));
      s.aux_layers.clear();
      for (const json& x : *it) {
        M3_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= target.num_layers,
                 "{}: eagle_config.eagle_aux_hidden_state_layer_ids holds {}, outside the target's layers [0, {}]",
                 r.file, json_brief(x), target.num_layers);
        const int l = int(x.get<int64_t>());
        M3_CHECK(std::find(s.aux_layers.begin(), s.aux_layers.end(), l) == s.aux_layers.end(),
                 "{}: eagle_config.eagle_aux_hidden_state_layer_ids lists layer {} twice", r.file, l);
        s.aux_layers.push_back(l);
      }
    }
    auto use = ec->find("use_aux_hidden_state");
    M3_CHECK(use == ec->end() || use->is_null() || *use == true,
             "{}: eagle_config.use_aux_hidden_state false (drafts without the target's hidden states) is not supported",
             r.file);
  }
  M3_CHECK(s.num_heads % s.num_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           r.file, s.num_heads, s.num_kv_heads);
  M3_CHECK(s.head_dim % 2 == 0, "{}: head_dim {} is odd (RoPE rotates pairs)", r.file, s.head_dim);
  M3_CHECK(s.target_hidden == target.hidden, "{}: target_hidden_size {} but the target's hidden_size is {}", r.file,
           s.target_hidden, target.hidden);
  M3_CHECK(s.vocab == target.vocab_size, "{}: vocab_size {} but the target's vocabulary has {} tokens", r.file, s.vocab,
           target.vocab_size);
  M3_CHECK(s.draft_vocab <= s.vocab, "{}: draft_vocab_size {} exceeds vocab_size {}", r.file, s.draft_vocab, s.vocab);
  return s;
}

std::string eagle3_spec_to_json(const Eagle3Spec& s) {
  json j;
  j["architectures"] = {"LlamaForCausalLMEagle3"};
  j["model_type"] = "llama";
  j["num_hidden_layers"] = 1;
  j["hidden_size"] = s.hidden;
  j["target_hidden_size"] = s.target_hidden;
  j["num_attention_heads"] = s.num_heads;
  j["num_key_value_heads"] = s.num_kv_heads;
  j["head_dim"] = s.head_dim;
  j["intermediate_size"] = s.intermediate;
  j["vocab_size"] = s.vocab;
  j["draft_vocab_size"] = s.draft_vocab;
  j["rms_norm_eps"] = std::stod(fmt::format("{}", s.rms_eps));  // the float's shortest spelling
  j["rope_theta"] = s.rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  if (s.rope_factor > 0)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_factor},
                         {"low_freq_factor", s.rope_low_freq},
                         {"high_freq_factor", s.rope_high_freq},
                         {"original_max_position_embeddings", s.rope_original_max}};
  j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", s.aux_layers}, {"use_aux_hidden_state", true}};
  return j.dump(2) + "\n";
}

std::vector<double> eagle3_inv_freq(const Eagle3Spec& s) {
  const int half = s.head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(s.rope_theta, double(2 * i) / double(s.head_dim));
    if (s.rope_factor > 0) {  // llama3: long wavelengths slowed by factor, a smooth ramp between
      const double lo_wave = s.rope_original_max / s.rope_low_freq, hi_wave = s.rope_original_max / s.rope_high_freq;
      const double wave = 2 * std::numbers::pi / f;
      if (wave > lo_wave) {
        f /= s.rope_factor;
      } else if (wave >= hi_wave) {
        const double smooth = (s.rope_original_max / wave - s.rope_low_freq) / (s.rope_high_freq - s.rope_low_freq);
        f = (1 - smooth) * f / s.rope_factor + smooth * f;
      }
    }
    inv_freq[size_t(i)] = f;
  }
  return inv_freq;
}

}  // namespace m3
