// config.json -> ModelSpec (and back). Two spellings of the same model exist in the wild:
//  - released:   sparse_attention_config{sparse_num_index_heads, sparse_index_dim, sparse_block_size,
//                sparse_topk_blocks, sparse_local_block, sparse_attention_freq}, moe_layer_freq,
//                rotary_dim and rope_theta at the top of text_config;
//  - normalized: what transformers writes: index_n_heads .. index_local_blocks, layer_types
//                ("full_attention"/"minimax_m3_sparse"), mlp_layer_types ("dense"/"sparse"),
//                rope_parameters{rope_theta, partial_rotary_factor}.
// Both may appear in one file; where they overlap they must agree. The per-layer plans are lists
// of 0/1 in the released config (one entry per layer). An integer is accepted too, read the way
// the DeepSeek-style configs read moe_layer_freq: layer l is sparse / MoE when
// l >= first_k_dense_replace (default 0) and l % freq == 0.
// Every rejection names the field (with its path inside config.json) and the value.
#include <nlohmann/json.hpp>

#include <cfloat>
#include <climits>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "model/config.h"
#include "model/json_brief.h"
#include "model/spec.h"

namespace m3 {

using json = nlohmann::json;

namespace {

std::string show(const json& j) { return json_brief(j); }  // bounded: the file may nest without end

// Typed access to one JSON object, with the object's path for messages ("text_config.").
// A key whose value is null counts as absent.
class Fields {
 public:
  Fields(const json& obj, std::string path, const std::string& origin)
      : obj_(obj), path_(std::move(path)), origin_(origin) {}

  std::string name(std::string_view key) const { return path_ + std::string(key); }
  const std::string& origin() const { return origin_; }

  const json* get(std::string_view key) const {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int to_int(const json& v, const std::string& field) const {
    M3_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", origin_, field, show(v));
    if (v.is_number_unsigned()) {
      M3_CHECK(v.get<uint64_t>() <= uint64_t(INT_MAX), "{}: field '{}' = {} is out of range", origin_, field, show(v));
    } else {
      int64_t x = v.get<int64_t>();
      M3_CHECK(x >= INT_MIN && x <= INT_MAX, "{}: field '{}' = {} is out of range", origin_, field, show(v));
    }
    return int(v.get<int64_t>());
  }
  std::optional<int> opt_int(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return to_int(*v, name(key));
  }
  int req_int(std::string_view key) const {
    auto v = opt_int(key);
    M3_CHECK(v.has_value(), "{}: required field '{}' is missing", origin_, name(key));
    return *v;
  }
  std::optional<double> opt_num(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    M3_CHECK(v->is_number(), "{}: field '{}' must be a number, got {}", origin_, name(key), show(*v));
    return v->get<double>();
  }
  // A number stored as float: must be finite and within float range (a double -> float cast of an
  // out-of-range value is undefined behaviour).
  float opt_float(std::string_view key, double def) const {
    double v = opt_num(key).value_or(def);
    M3_CHECK(std::isfinite(v) && std::fabs(v) <= double(FLT_MAX), "{}: field '{}' = {} is not a finite float", origin_,
             name(key), v);
    return float(v);
  }
  std::optional<std::string> opt_str(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    M3_CHECK(v->is_string(), "{}: field '{}' must be a string, got {}", origin_, name(key), show(*v));
    return v->get<std::string>();
  }
  std::optional<bool> opt_bool(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    M3_CHECK(v->is_boolean(), "{}: field '{}' must be true or false, got {}", origin_, name(key), show(*v));
    return v->get<bool>();
  }
  std::optional<Fields> opt_obj(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    M3_CHECK(v->is_object(), "{}: field '{}' must be an object, got {}", origin_, name(key), show(*v));
    return Fields(*v, name(key) + ".", origin_);
  }

 private:
  const json& obj_;
  std::string path_;
  const std::string& origin_;
};

// One value that may be spelled in several places; all present spellings must agree.
struct Src {
  const Fields* f;
  std::string_view key;
};
std::optional<int> agree_int(std::initializer_list<Src> srcs) {
  std::optional<int> val;
  std::string first;
  for (const auto& s : srcs) {
    if (!s.f) continue;
    auto v = s.f->opt_int(s.key);
    if (!v) continue;
    if (val) {
      M3_CHECK(*v == *val, "{}: field '{}' = {} disagrees with '{}' = {}", s.f->origin(), s.f->name(s.key), *v,
               first, *val);
    } else {
      val = v;
      first = s.f->name(s.key);
    }
  }
  return val;
}

// A per-layer on/off plan given as a 0/1 (or bool) list or as an integer frequency.
std::vector<bool> parse_freq(const Fields& f, std::string_view key, int num_layers, int first_dense) {
  const json& v = *f.get(key);
  std::vector<bool> out(size_t(num_layers), false);
  if (v.is_array()) {
    M3_CHECK(v.size() == size_t(num_layers), "{}: field '{}' has {} entries, num_hidden_layers is {}", f.origin(),
             f.name(key), v.size(), num_layers);
    for (size_t l = 0; l < v.size(); ++l) {
      const json& e = v[l];
      if (e.is_boolean()) {
        out[l] = e.get<bool>();
      } else {
        M3_CHECK(e.is_number_integer() && (e.get<int64_t>() == 0 || e.get<int64_t>() == 1),
                 "{}: field '{}[{}]' must be 0, 1, true or false, got {}", f.origin(), f.name(key), l, show(e));
        out[l] = e.get<int64_t>() == 1;
      }
    }
    return out;
  }
  M3_CHECK(v.is_number_integer(), "{}: field '{}' must be a per-layer 0/1 list or an integer, got {}", f.origin(),
           f.name(key), show(v));
  int k = f.to_int(v, f.name(key));
  M3_CHECK(k >= 1, "{}: field '{}' must be >= 1 when an integer, got {}", f.origin(), f.name(key), k);
  for (int l = 0; l < num_layers; ++l) out[size_t(l)] = l >= first_dense && l % k == 0;
  return out;
}

// A per-layer plan given as strings; `on` and `off` are the two accepted spellings.
std::vector<bool> parse_types(const Fields& f, std::string_view key, int num_layers, const char* off, const char* on) {
  const json& v = *f.get(key);
  M3_CHECK(v.is_array(), "{}: field '{}' must be a list of strings, got {}", f.origin(), f.name(key), show(v));
  M3_CHECK(v.size() == size_t(num_layers), "{}: field '{}' has {} entries, num_hidden_layers is {}", f.origin(),
           f.name(key), v.size(), num_layers);
  std::vector<bool> out(v.size());
  for (size_t l = 0; l < v.size(); ++l) {
    const json& e = v[l];
    M3_CHECK(e.is_string(), "{}: field '{}[{}]' must be a string, got {}", f.origin(), f.name(key), l, show(e));
    const auto& s = e.get_ref<const std::string&>();
    if (s == on) out[l] = true;
    else if (s == off) out[l] = false;
    else M3_FAIL("{}: field '{}[{}]' = \"{}\" is not a known layer type (expected \"{}\" or \"{}\")", f.origin(),
                 f.name(key), l, s, off, on);
  }
  return out;
}

// Combines the string plan and the frequency plan; at least one must be present, and when both
// are they must agree layer by layer.
std::vector<bool> layer_plan(const Fields& types_f, std::string_view types_key, const char* off, const char* on,
                             const Fields* freq_f, std::string_view freq_key, int num_layers, int first_dense) {
  std::optional<std::vector<bool>> a, b;
  if (types_f.get(types_key)) a = parse_types(types_f, types_key, num_layers, off, on);
  if (freq_f && freq_f->get(freq_key)) b = parse_freq(*freq_f, freq_key, num_layers, first_dense);
  M3_CHECK(a || b, "{}: missing layer plan: neither '{}' nor '{}' is present", types_f.origin(),
           types_f.name(types_key),
           freq_f ? freq_f->name(freq_key) : types_f.name("sparse_attention_config." + std::string(freq_key)));
  if (a && b) {
    for (size_t l = 0; l < a->size(); ++l)
      M3_CHECK((*a)[l] == (*b)[l], "{}: '{}' and '{}' disagree at layer {}: \"{}\" vs {}", types_f.origin(),
               types_f.name(types_key), freq_f->name(freq_key), l, (*a)[l] ? on : off, (*b)[l] ? 1 : 0);
  }
  return a ? *a : *b;
}

// A string field that, when present, must have the one value the math implements.
void expect_str(const Fields& f, std::string_view key, std::string_view want) {
  auto v = f.opt_str(key);
  M3_CHECK(!v || *v == want, "{}: field '{}' = \"{}\" is not supported (only \"{}\")", f.origin(), f.name(key), *v,
           want);
}
void expect_bool(const Fields& f, std::string_view key, bool want) {
  auto v = f.opt_bool(key);
  M3_CHECK(!v || *v == want, "{}: field '{}' = {} is not supported (only {})", f.origin(), f.name(key), *v, want);
}

std::optional<int> token_id(const Fields& f, std::string_view key) {
  const json* v = f.get(key);
  if (!v) return std::nullopt;
  if (v->is_array()) {  // several stop ids: the first is the one the spec keeps
    if (v->empty()) return std::nullopt;
    return f.to_int((*v)[0], f.name(key) + "[0]");
  }
  return f.to_int(*v, f.name(key));
}

}  // namespace

ModelSpec parse_model_spec_json(const std::string& json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    M3_FAIL("{}: invalid JSON: {}", origin, e.what());
  }
  M3_CHECK(root.is_object(), "{}: the top level must be a JSON object, got {}", origin, show(root));
  Fields top(root, "", origin);
  std::optional<Fields> nested = top.opt_obj("text_config");
  const Fields& t = nested ? *nested : top;

  ModelSpec s;
  s.vocab_size = t.req_int("vocab_size");
  s.hidden = t.req_int("hidden_size");
  s.num_layers = t.req_int("num_hidden_layers");
  M3_CHECK(s.num_layers > 0 && s.num_layers <= kMaxLayers, "{}: field '{}' must be in [1, {}], got {}", origin,
           t.name("num_hidden_layers"), kMaxLayers, s.num_layers);
  s.num_heads = t.req_int("num_attention_heads");
  s.num_kv_heads = t.req_int("num_key_value_heads");
  s.head_dim = t.req_int("head_dim");
  s.rms_eps = t.opt_float("rms_norm_eps", 1e-6);
  s.max_positions = t.opt_int("max_position_embeddings").value_or(0);
  s.bos_id = token_id(t, "bos_token_id").value_or(-1);
  s.eos_id = token_id(t, "eos_token_id").value_or(-1);

  // RoPE: theta and the rotated width may each be given in two places.
  std::optional<Fields> rope = t.opt_obj("rope_parameters");
  if (rope) expect_str(*rope, "rope_type", "default");
  if (auto rs = t.opt_obj("rope_scaling")) {
    auto ty = rs->opt_str("rope_type");
    if (!ty) ty = rs->opt_str("type");
    M3_CHECK(ty && *ty == "default", "{}: field '{}' (rope scaling) is not supported; only default RoPE", origin,
             t.name("rope_scaling"));
  }
  std::optional<double> theta = t.opt_num("rope_theta");
  if (rope) {
    if (auto th = rope->opt_num("rope_theta")) {
      M3_CHECK(!theta || *theta == *th, "{}: field '{}' = {} disagrees with '{}' = {}", origin,
               rope->name("rope_theta"), *th, t.name("rope_theta"), *theta);
      theta = th;
    }
  }
  M3_CHECK(theta.has_value(), "{}: required field '{}' (or '{}') is missing", origin, t.name("rope_theta"),
           t.name("rope_parameters.rope_theta"));
  s.rope_theta = *theta;
  std::optional<double> factor = t.opt_num("partial_rotary_factor");
  std::string factor_name = t.name("partial_rotary_factor");
  if (rope) {
    if (auto fr = rope->opt_num("partial_rotary_factor")) {
      M3_CHECK(!factor || *factor == *fr, "{}: field '{}' = {} disagrees with '{}' = {}", origin,
               rope->name("partial_rotary_factor"), *fr, factor_name, *factor);
      factor = fr;
      factor_name = rope->name("partial_rotary_factor");
    }
  }
  std::optional<int> rotary = t.opt_int("rotary_dim");
  if (factor) {
    double want = *factor * double(s.head_dim);
    if (rotary) {
      M3_CHECK(std::fabs(want - double(*rotary)) < 1e-6, "{}: field '{}' = {} disagrees with '{}' = {} (x head_dim {} = {})",
               origin, t.name("rotary_dim"), *rotary, factor_name, *factor, s.head_dim, want);
    } else {
      M3_CHECK(std::isfinite(want) && std::fabs(want - std::round(want)) < 1e-6 && want >= 0 && want <= 1e9,
               "{}: field '{}' = {} times head_dim {} is not a whole number of channels", origin, factor_name, *factor,
               s.head_dim);
      rotary = int(std::lround(want));
    }
  }
  M3_CHECK(rotary.has_value(), "{}: required field '{}' (or '{}') is missing", origin, t.name("rotary_dim"),
           t.name("rope_parameters.partial_rotary_factor"));
  s.rotary_dim = *rotary;

  // Math switches that released configs spell out; anything else would be a different model.
  expect_str(t, "scoring_func", "sigmoid");
  expect_bool(t, "use_routing_bias", true);
  expect_bool(t, "use_gemma_norm", true);
  expect_bool(t, "use_qk_norm", true);
  expect_str(t, "qk_norm_type", "per_head");
  expect_bool(t, "tie_word_embeddings", false);
  if (nested) expect_bool(top, "tie_word_embeddings", false);

  // Layer plan.
  std::optional<Fields> sparse = t.opt_obj("sparse_attention_config");
  int first_dense = t.opt_int("first_k_dense_replace").value_or(0);
  std::vector<bool> is_sparse, is_moe;
  bool use_sparse = sparse ? sparse->opt_bool("use_sparse_attention").value_or(true) : true;
  if (!use_sparse && !t.get("layer_types") && !sparse->get("sparse_attention_freq")) {
    is_sparse.assign(size_t(s.num_layers), false);
  } else {
    is_sparse = layer_plan(t, "layer_types", "full_attention", "minimax_m3_sparse", sparse ? &*sparse : nullptr,
                           "sparse_attention_freq", s.num_layers, first_dense);
  }
  if (!use_sparse) {
    for (size_t l = 0; l < is_sparse.size(); ++l)
      M3_CHECK(!is_sparse[l], "{}: field '{}' is false but layer {} is marked sparse", origin,
               sparse->name("use_sparse_attention"), l);
  }
  is_moe = layer_plan(t, "mlp_layer_types", "dense", "sparse", &t, "moe_layer_freq", s.num_layers, first_dense);
  for (int l = 0; l < s.num_layers; ++l) {
    s.attn.push_back(is_sparse[size_t(l)] ? AttnKind::Sparse : AttnKind::Full);
    s.mlp.push_back(is_moe[size_t(l)] ? MlpKind::MoE : MlpKind::Dense);
  }
  bool any_sparse = s.num_sparse_layers() > 0, any_moe = s.num_moe_layers() > 0;
  bool any_dense = s.num_moe_layers() < s.num_layers;

  // MLP widths and routing. Widths are required only where a layer uses them.
  auto width = [&](std::string_view key, bool needed) {
    return needed ? t.req_int(key) : t.opt_int(key).value_or(0);
  };
  s.dense_inter = width("dense_intermediate_size", any_dense);
  s.moe_inter = width("intermediate_size", any_moe);
  s.num_experts = width("num_local_experts", any_moe);
  s.top_k = width("num_experts_per_tok", any_moe);
  int n_shared = t.opt_int("n_shared_experts").value_or(1);
  M3_CHECK(n_shared == 0 || n_shared == 1, "{}: field '{}' = {} is not supported (0 or 1 shared expert)", origin,
           t.name("n_shared_experts"), n_shared);
  s.shared_inter = n_shared ? t.opt_int("shared_intermediate_size").value_or(0) : 0;
  s.routed_scale = t.opt_float("routed_scaling_factor", 1.0);
  s.swiglu_alpha = t.opt_float("swiglu_alpha", 1.702);
  s.swiglu_limit = t.opt_float("swiglu_limit", 7.0);

  // Indexer. The released names live inside sparse_attention_config.
  const Fields* sp = sparse ? &*sparse : nullptr;
  auto index_field = [&](std::string_view norm, std::string_view rel, bool needed) {
    auto v = agree_int({{&t, norm}, {sp, rel}});
    M3_CHECK(v || !needed, "{}: required field '{}' (or '{}') is missing", origin, t.name(norm),
             sp ? sp->name(rel) : t.name("sparse_attention_config." + std::string(rel)));
    return v.value_or(0);
  };
  s.index_heads = index_field("index_n_heads", "sparse_num_index_heads", any_sparse);
  s.index_dim = index_field("index_head_dim", "sparse_index_dim", any_sparse);
  s.index_block = index_field("index_block_size", "sparse_block_size", any_sparse);
  s.index_topk = index_field("index_topk_blocks", "sparse_topk_blocks", any_sparse);
  s.index_local = agree_int({{&t, "index_local_blocks"}, {sp, "sparse_local_block"}}).value_or(1);
  if (sp) {
    expect_str(*sp, "sparse_score_type", "max");
    // m3-model.md defines no always-kept initial blocks; a non-zero count would change selection.
    auto init = sp->opt_int("sparse_init_block");
    M3_CHECK(!init || *init == 0, "{}: field '{}' = {} is not supported (only 0)", origin,
             sp->name("sparse_init_block"), *init);
    // NOTE: sparse_disable_index_value (per layer) is accepted and not used: the math in
    // m3-model.md never feeds index values into attention.
  }

  s.validate(origin);
  return s;
}

ModelSpec load_model_spec(const std::filesystem::path& model_dir) {
  std::filesystem::path p = model_dir;
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  std::ifstream in(p, std::ios::binary);
  M3_CHECK(in.good(), "cannot open model config '{}'", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  M3_CHECK(!in.bad(), "error reading '{}'", p.string());
  return parse_model_spec_json(ss.str(), p.string());
}

namespace {
// Shortest decimal of a float, as a double (so 1e-6f is written as 1e-06, not 9.99999997e-07).
double shortest(float f) { return std::stod(fmt::format("{}", f)); }
}  // namespace

std::string model_spec_to_json(const ModelSpec& s, ConfigSpelling spelling, bool nested) {
  json t = json::object();
  t["vocab_size"] = s.vocab_size;
  t["hidden_size"] = s.hidden;
  t["num_hidden_layers"] = s.num_layers;
  t["num_attention_heads"] = s.num_heads;
  t["num_key_value_heads"] = s.num_kv_heads;
  t["head_dim"] = s.head_dim;
  t["rotary_dim"] = s.rotary_dim;
  t["rms_norm_eps"] = shortest(s.rms_eps);
  t["max_position_embeddings"] = s.max_positions;
  t["bos_token_id"] = s.bos_id >= 0 ? json(s.bos_id) : json(nullptr);
  t["eos_token_id"] = s.eos_id >= 0 ? json(s.eos_id) : json(nullptr);
  t["dense_intermediate_size"] = s.dense_inter;
  t["intermediate_size"] = s.moe_inter;
  t["shared_intermediate_size"] = s.shared_inter;
  t["num_local_experts"] = s.num_experts;
  t["num_experts_per_tok"] = s.top_k;
  t["routed_scaling_factor"] = shortest(s.routed_scale);
  t["swiglu_alpha"] = shortest(s.swiglu_alpha);
  t["swiglu_limit"] = shortest(s.swiglu_limit);
  t["tie_word_embeddings"] = false;
  json attn_freq = json::array(), moe_freq = json::array(), layer_types = json::array(), mlp_types = json::array();
  for (int l = 0; l < s.num_layers; ++l) {
    attn_freq.push_back(s.sparse(l) ? 1 : 0);
    moe_freq.push_back(s.moe(l) ? 1 : 0);
    layer_types.push_back(s.sparse(l) ? "minimax_m3_sparse" : "full_attention");
    mlp_types.push_back(s.moe(l) ? "sparse" : "dense");
  }
  if (spelling == ConfigSpelling::Released) {
    t["model_type"] = "minimax_m3";
    t["rope_theta"] = s.rope_theta;
    t["hidden_act"] = "swigluoai";
    t["n_shared_experts"] = s.shared_inter > 0 ? 1 : 0;
    t["scoring_func"] = "sigmoid";
    t["use_routing_bias"] = true;
    t["use_gemma_norm"] = true;
    t["use_qk_norm"] = true;
    t["qk_norm_type"] = "per_head";
    t["moe_layer_freq"] = moe_freq;
    t["sparse_attention_config"] = {
        {"use_sparse_attention", s.num_sparse_layers() > 0},
        {"sparse_num_index_heads", s.index_heads},
        {"sparse_index_dim", s.index_dim},
        {"sparse_block_size", s.index_block},
        {"sparse_topk_blocks", s.index_topk},
        {"sparse_local_block", s.index_local},
        {"sparse_init_block", 0},
        {"sparse_score_type", "max"},
        {"sparse_attention_freq", attn_freq},
        {"sparse_disable_index_value", attn_freq},
    };
  } else {
    t["model_type"] = "minimax_m3_vl_text";
    t["hidden_act"] = "silu";
    t["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", s.rope_theta},
                            {"partial_rotary_factor", double(s.rotary_dim) / double(s.head_dim)}};
    t["index_n_heads"] = s.index_heads;
    t["index_head_dim"] = s.index_dim;
    t["index_block_size"] = s.index_block;
    t["index_topk_blocks"] = s.index_topk;
    t["index_local_blocks"] = s.index_local;
    t["layer_types"] = layer_types;
    t["mlp_layer_types"] = mlp_types;
  }
  if (!nested) return t.dump(2) + "\n";
  json root = {{"architectures", {"MiniMaxM3SparseForConditionalGeneration"}},
               {"model_type", "minimax_m3_vl"},
               {"tie_word_embeddings", false},
               {"text_config", t}};
  return root.dump(2) + "\n";
}

}  // namespace m3
