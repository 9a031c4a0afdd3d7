// Synthetic checkpoints: presets, the counter-based normal generator, and the writer.
// NOTE: values come from a hash of (seed, tensor name, element index) rather than a sequential
// RNG stream, so a tensor's values do not depend on which other tensors exist or their order;
// tests can regenerate any single tensor.
#include "model/synthetic.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "core/check.h"
#include "core/codecs.h"
#include "model/load_weights.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace m3 {

namespace {

ModelSpec base_spec(int layers, int full_dense_layers) {
  ModelSpec s;
  s.rope_theta = 5e6;
  s.rms_eps = 1e-6f;
  s.routed_scale = 2.0f;
  s.swiglu_alpha = 1.702f;
  s.swiglu_limit = 7.0f;
  s.index_local = 1;
  s.bos_id = 1;
  s.eos_id = 2;
  s.num_layers = layers;
  for (int l = 0; l < layers; ++l) {
    bool first = l < full_dense_layers;
    s.attn.push_back(first ? AttnKind::Full : AttnKind::Sparse);
    s.mlp.push_back(first ? MlpKind::Dense : MlpKind::MoE);
  }
  return s;
}

}  // namespace

std::vector<std::string> synthetic_preset_names() { return {"tiny", "small", "real-heads", "real"}; }

bool synthetic_preset_writable(const std::string& name) { return name != "real"; }

ModelSpec synthetic_preset(const std::string& name) {
  ModelSpec s;
  if (name == "tiny") {  // tiny-m3-a's shape
    s = base_spec(4, 1);
    s.vocab_size = 1024;
    s.hidden = 256;
    s.num_heads = 8;
    s.num_kv_heads = 2;
    s.head_dim = 64;
    s.rotary_dim = 32;
    s.dense_inter = 256;
    s.moe_inter = 64;
    s.shared_inter = 64;
    s.num_experts = 16;
    s.top_k = 4;
    s.index_heads = 2;
    s.index_dim = 64;
    s.index_block = 16;
    s.index_topk = 4;
    s.max_positions = 4096;
  } else if (name == "small") {
    s = base_spec(6, 2);
    s.vocab_size = 4096;
    s.hidden = 512;
    s.num_heads = 16;
    s.num_kv_heads = 4;
    s.head_dim = 64;
    s.rotary_dim = 32;
    s.dense_inter = 1024;
    s.moe_inter = 128;
    s.shared_inter = 128;
    s.num_experts = 16;
    s.top_k = 4;
    s.index_heads = 4;
    s.index_dim = 64;
    s.index_block = 32;
    s.index_topk = 4;
    s.max_positions = 8192;
  } else if (name == "real-heads") {
    // The released attention and indexer geometry with everything else shrunk: about 110 M
    // parameters (~220 MB bf16), nearly all of it the 64-head q/o projections.
    s = base_spec(5, 1);
    s.vocab_size = 1024;
    s.hidden = 1024;
    s.num_heads = 64;
    s.num_kv_heads = 4;
    s.head_dim = 128;
    s.rotary_dim = 64;
    s.dense_inter = 512;
    s.moe_inter = 128;
    s.shared_inter = 128;
    s.num_experts = 8;
    s.top_k = 4;
    s.index_heads = 4;
    s.index_dim = 128;
    s.index_block = 128;
    s.index_topk = 16;
    s.max_positions = 65536;
  } else if (name == "real") {  // the released MiniMax-M3 text model (m3-model.md, "Shapes")
    s = base_spec(60, 3);
    s.vocab_size = 200064;
    s.hidden = 6144;
    s.num_heads = 64;
    s.num_kv_heads = 4;
    s.head_dim = 128;
    s.rotary_dim = 64;
    s.dense_inter = 12288;
    s.moe_inter = 3072;
    s.shared_inter = 3072;
    s.num_experts = 128;
    s.top_k = 4;
    s.index_heads = 4;
    s.index_dim = 128;
    s.index_block = 128;
    s.index_topk = 16;
    s.max_positions = 1048576;
    s.bos_id = -1;
    s.eos_id = -1;
  } else {
    std::string names;
    for (const auto& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
    M3_FAIL("unknown preset '{}' (known: {})", name, names);
  }
  s.validate("preset " + name);
  return s;
}

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return splitmix(h ^ splitmix(seed));
}

// n standard normals (Box-Muller on counter-hashed uniforms) times `stddev`, rounded to `dt`.
void normals(uint64_t key, float stddev, DType dt, size_t n, float* out) {
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t p = 0; 2 * p < n; ++p) {
    uint64_t a = splitmix(key + 2 * p), b = splitmix(key + 2 * p + 1);
    double u1 = (double(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = double(b >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    out[2 * p] = float(r * std::cos(kTwoPi * u2) * stddev);
    if (2 * p + 1 < n) out[2 * p + 1] = float(r * std::sin(kTwoPi * u2) * stddev);
  }
  if (dt == DType::BF16)
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(f32_to_bf16(out[i]));
}

size_t count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (auto d : shape) n *= size_t(d);
  return n;
}

float entry_std(const WeightEntry& e, const SyntheticOptions& o) {
  switch (e.role) {
    case WeightRole::FinalNorm: case WeightRole::InputNorm: case WeightRole::PostNorm:
    case WeightRole::QNorm: case WeightRole::KNorm: case WeightRole::IndexQNorm: case WeightRole::IndexKNorm:
      return o.norm_std;
    case WeightRole::RouterBias:
      return o.bias_std;
    default:
      return o.weight_std;
  }
}

// Tensors of the vision side that a text engine must ignore (shapes loosely like tiny-m3-a's).
struct Extra {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<Extra> extras(const ModelSpec& s, const SyntheticOptions& o) {
  std::vector<Extra> x;
  if (o.vision) {
    x.push_back({"vision_tower.vision_model.embeddings.patch_embedding.weight", {32, 3, 2, 14, 14}});
    x.push_back({"vision_tower.vision_model.pre_layrnorm.weight", {32}});
    x.push_back({"multi_modal_projector.linear_1.weight", {s.hidden, 32}});
    x.push_back({"multi_modal_projector.linear_1.bias", {s.hidden}});
    x.push_back({"patch_merge_mlp.linear_1.weight", {32, 128}});
  }
  if (o.mtp) x.push_back({"mtp.layers.0.input_layernorm.weight", {s.hidden}});
  return x;
}

std::vector<uint8_t> to_bytes(const float* v, size_t n, DType dt) {
  std::vector<uint8_t> out(n * dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(out.data(), v, n * 4);
  } else {
    M3_CHECK(dt == DType::BF16, "synthetic: unsupported dtype {}", dtype_name(dt));
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}


// The format `f` stores entry e in (the quantization_config written with it declares the same;
// loading checks that).
WeightQuant format_quant(const WeightEntry& e, SyntheticFormat f) {
  if (!e.matrix() || e.role == WeightRole::Embed || e.role == WeightRole::LmHead || e.role == WeightRole::Router)
    return WeightQuant::Float;
  switch (f) {
    case SyntheticFormat::Bf16: return WeightQuant::Float;
    case SyntheticFormat::Mxfp8: return WeightQuant::Mxfp8;
    case SyntheticFormat::Mxfp4:
    case SyntheticFormat::Mxfp4AttnFp8:
      if (expert_linear(e.role)) return WeightQuant::Mxfp4;
      if (f == SyntheticFormat::Mxfp4AttnFp8 && attention_linear(e.role)) return WeightQuant::Fp8Tensor;
      return WeightQuant::Float;
  }
  return WeightQuant::Float;
}

// An entry's values quantized to q: the stored codes and scales, and the values they dequantize to
// (by the same formulas the loader reads them with: code value x scale, one fp32 multiply).
struct Quantized {
  std::vector<uint8_t> codes, scales;  // codes [rows][row bytes as stored]; scales E8M0 or one F32
  std::vector<float> values;
};
Quantized quantize_entry(const WeightEntry& e, WeightQuant q, const float* v) {
  const int64_t rows = e.shape[0], cols = e.shape[1];
  const int64_t blocks = mxfp4_row_blocks(cols);
  Quantized out;
  out.values.resize(size_t(rows * cols));
  switch (q) {
    case WeightQuant::Mxfp8:
      out.codes.resize(size_t(rows * cols));
      out.scales.resize(size_t(rows * blocks));
      for (int64_t r = 0; r < rows; ++r) {
        quantize_mxfp8_row(v + r * cols, cols, out.codes.data() + r * cols, out.scales.data() + r * blocks);
        dequantize_mxfp8_row(out.codes.data() + r * cols, out.scales.data() + r * blocks, cols,
                             out.values.data() + r * cols);
      }
      break;
    case WeightQuant::Mxfp4: {
      const int64_t ld = (cols + 1) / 2;
      std::vector<uint8_t> row(size_t(mxfp4_row_bytes(cols)));
      out.codes.resize(size_t(rows * ld));
      out.scales.resize(size_t(rows * blocks));
      for (int64_t r = 0; r < rows; ++r) {
        quantize_mxfp4_row(v + r * cols, cols, row.data(), out.scales.data() + r * blocks);
        std::memcpy(out.codes.data() + r * ld, row.data(), size_t(ld));
        dequantize_mxfp4_row(row.data(), out.scales.data() + r * blocks, cols, out.values.data() + r * cols);
      }
      break;
    }
    case WeightQuant::Fp8Tensor: {
      float amax = 0;
      for (int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float scale = amax > 0 ? amax / kE4M3Max : 1.0f;
      out.codes.resize(size_t(rows * cols));
      out.scales.resize(4);
      std::memcpy(out.scales.data(), &scale, 4);
      for (int64_t i = 0; i < rows * cols; ++i) {
        out.codes[size_t(i)] = f32_to_e4m3(v[i] / scale);
        out.values[size_t(i)] = e4m3_to_f32(out.codes[size_t(i)]) * scale;
      }
      break;
    }
    case WeightQuant::Float: M3_FAIL("synthetic: {} is not quantized", e.describe());
  }
  return out;
}

// The generator's raw values of e (before any quantization).
void raw_values(const WeightEntry& e, const SyntheticOptions& opt, float* out) {
  normals(name_key(opt.seed, e.names[0]), entry_std(e, opt), e.dtype, count(e.shape), out);
}

// The quantization_config of format f (null for bf16), as the releases spell theirs.
nlohmann::json quant_config_json(const ModelSpec& spec, const WeightTable& table, SyntheticFormat f,
                                 DenseMlpSpelling dense) {
  using json = nlohmann::json;
  if (f == SyntheticFormat::Bf16) return json();
  if (f == SyntheticFormat::Mxfp8)
    return json{{"quant_method", "mxfp8"},
                {"weight_block_size", {1, 32}},
                {"modules_to_not_convert", {"lm_head", "*block_sparse_moe.gate"}}};
  const json mx = {{"dtype", "fp4"},           {"qscheme", "per_group"}, {"group_size", 32}, {"ch_axis", -1},
                   {"scale_format", "e8m0"},   {"is_dynamic", false},    {"round_method", "half_even"}};
  json mx_in = mx;
  mx_in["is_dynamic"] = true;
  // excluded: lm_head, the router (a glob), every dense MLP linear by its full name (as Quark
  // lists them), and the attention (a glob) unless it has its own FP8 rule
  json exclude = json::array({"lm_head", "*block_sparse_moe.gate"});
  for (const auto& e : table.entries)
    if (e.role == WeightRole::DenseGate || e.role == WeightRole::DenseUp || e.role == WeightRole::DenseDown) {
      const std::string& n = dense == DenseMlpSpelling::BlockSparseMoe && e.names.size() > 1 ? e.names[1] : e.names[0];
      exclude.push_back(n.substr(0, n.size() - std::string_view(".weight").size()));
    }
  json layers = json::object();
  if (f == SyntheticFormat::Mxfp4) {
    exclude.push_back("*self_attn*");
  } else {
    const json fp8 = {{"dtype", "fp8_e4m3"}, {"qscheme", "per_tensor"}, {"is_dynamic", false}};
    layers["*self_attn*"] = {{"weight", fp8}, {"input_tensors", fp8}};
  }
  (void)spec;
  return json{{"quant_method", "quark"},
              {"global_quant_config", {{"weight", mx}, {"input_tensors", mx_in}}},
              {"layer_quant_config", layers},
              {"exclude", exclude},
              {"export", {{"pack_method", "reorder"}, {"weight_format", "real_quantized"}}}};
}

constexpr float kSyntheticInputScale = 0.0234375f;  // a static activation scale (written, never read)

}  // namespace

std::vector<std::string> synthetic_format_names() { return {"bf16", "mxfp8", "mxfp4", "mxfp4-attn-fp8"}; }

std::string_view synthetic_format_name(SyntheticFormat f) {
  switch (f) {
    case SyntheticFormat::Bf16: return "bf16";
    case SyntheticFormat::Mxfp8: return "mxfp8";
    case SyntheticFormat::Mxfp4: return "mxfp4";
    case SyntheticFormat::Mxfp4AttnFp8: return "mxfp4-attn-fp8";
  }
  return "?";
}

SyntheticFormat parse_synthetic_format(const std::string& name) {
  for (SyntheticFormat f : {SyntheticFormat::Bf16, SyntheticFormat::Mxfp8, SyntheticFormat::Mxfp4,
                            SyntheticFormat::Mxfp4AttnFp8})
    if (synthetic_format_name(f) == name) return f;
  M3_FAIL("unknown format '{}' (known: bf16, mxfp8, mxfp4, mxfp4-attn-fp8)", name);
}

void synthetic_values(const WeightEntry& e, const SyntheticOptions& opt, float* out) {
  raw_values(e, opt, out);
  const WeightQuant q = format_quant(e, opt.format);
  if (q == WeightQuant::Float) return;
  Quantized z = quantize_entry(e, q, out);
  std::memcpy(out, z.values.data(), z.values.size() * 4);
}

ModelWeights synthetic_weights(const ModelSpec& spec, const SyntheticOptions& opt) {
  ModelWeights w = allocate_model_weights(spec);
  for (const auto& e : build_weight_table(spec).entries) synthetic_values(e, opt, host_destination(w, e));
  return w;
}

uint64_t write_synthetic_checkpoint(const std::filesystem::path& dir, const ModelSpec& spec,
                                    const SyntheticOptions& opt) {
  spec.validate("synthetic checkpoint");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  M3_CHECK(!ec, "{}: cannot create directory: {}", dir.string(), ec.message());

  // Every tensor with a fill producing its bytes; then they are dealt out to the shard files.
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    SafetensorsWriter::Fill fill;
    uint64_t bytes;
  };
  std::vector<Pending> all;
  WeightTable table = build_weight_table(spec);
  for (const auto& e : table.entries) {
    std::string name = e.names[0];
    if (opt.dense_spelling == DenseMlpSpelling::BlockSparseMoe && e.names.size() > 1) name = e.names[1];
    const WeightEntry* ep = &e;
    SyntheticOptions o = opt;
    o.progress = nullptr;
    if (const WeightQuant q = format_quant(e, opt.format); q != WeightQuant::Float) {
      // the codes and their scales, each filled from one quantization of the raw values
      const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
      auto part = [ep, o, q](bool scales) {
        return [ep, o, q, scales](uint8_t* dst, size_t nbytes) {
          std::vector<float> v(count(ep->shape));
          raw_values(*ep, o, v.data());
          Quantized z = quantize_entry(*ep, q, v.data());
          const auto& b = scales ? z.scales : z.codes;
          M3_CHECK(b.size() == nbytes, "synthetic: size mismatch for {}", ep->names[0]);
          std::memcpy(dst, b.data(), nbytes);
        };
      };
      const int64_t rows = e.shape[0], cols = e.shape[1], blocks = mxfp4_row_blocks(cols);
      if (q == WeightQuant::Mxfp4) {
        all.push_back({name, DType::U8, {rows, (cols + 1) / 2}, part(false), uint64_t(rows * ((cols + 1) / 2))});
        all.push_back({module + ".weight_scale", DType::U8, {rows, blocks}, part(true), uint64_t(rows * blocks)});
      } else {
        all.push_back({name, DType::F8_E4M3, {rows, cols}, part(false), uint64_t(rows * cols)});
        if (q == WeightQuant::Mxfp8) {
          all.push_back(
              {module + ".weight_scale_inv", DType::U8, {rows, blocks}, part(true), uint64_t(rows * blocks)});
        } else {
          all.push_back({module + ".weight_scale", DType::F32, {}, part(true), 4});
          all.push_back({module + ".input_scale", DType::F32, {},
                         [](uint8_t* dst, size_t) { std::memcpy(dst, &kSyntheticInputScale, 4); }, 4});
        }
      }
      continue;
    }
    auto fill = [ep, o](uint8_t* dst, size_t nbytes) {
      std::vector<float> v(count(ep->shape));
      synthetic_values(*ep, o, v.data());
      auto b = to_bytes(v.data(), v.size(), ep->dtype);
      M3_CHECK(b.size() == nbytes, "synthetic: size mismatch for {}", ep->names[0]);
      std::memcpy(dst, b.data(), nbytes);
    };
    all.push_back({name, e.dtype, e.shape, fill, count(e.shape) * dtype_size(e.dtype)});
  }
  for (const auto& x : extras(spec, opt)) {
    std::vector<float> v(count(x.shape));
    normals(name_key(opt.seed, x.name), opt.weight_std, DType::BF16, v.size(), v.data());
    auto bytes = std::make_shared<std::vector<uint8_t>>(to_bytes(v.data(), v.size(), DType::BF16));
    all.push_back({x.name, DType::BF16, x.shape,
                   [bytes](uint8_t* dst, size_t n) { std::memcpy(dst, bytes->data(), n); }, bytes->size()});
  }

  {
    std::ofstream cfg(dir / "config.json", std::ios::trunc);
    M3_CHECK(cfg.good(), "{}: cannot write", (dir / "config.json").string());
    const std::string text = model_spec_to_json(spec, opt.config_spelling, true);
    if (auto q = quant_config_json(spec, table, opt.format, opt.dense_spelling); q.is_null()) {
      cfg << text;
    } else {
      auto j = nlohmann::ordered_json::parse(text);
      j["quantization_config"] = nlohmann::ordered_json::parse(q.dump());
      cfg << j.dump(2) << "\n";
    }
    M3_CHECK(cfg.good(), "{}: write failed", (dir / "config.json").string());
  }

  M3_CHECK(opt.shards >= 1 && size_t(opt.shards) <= all.size(), "synthetic: shards must be in [1, {}], got {}",
           all.size(), opt.shards);
  uint64_t total = 0;
  for (const auto& p : all) total += p.bytes;
  std::vector<SafetensorsWriter> writers(size_t(opt.shards));
  std::vector<std::string> files(size_t(opt.shards));
  for (int i = 0; i < opt.shards; ++i) {
    writers[size_t(i)].set_metadata("format", "pt");
    files[size_t(i)] = opt.shards == 1 ? "model.safetensors"
                                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, opt.shards);
  }
  std::map<std::string, std::string> weight_map;
  uint64_t before = 0;
  size_t prev = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    // shard by position in the byte stream, moving on at most one shard per tensor and early
    // enough that no shard is left empty
    size_t i = size_t(double(before) / double(total) * opt.shards);
    i = std::max(i, size_t(opt.shards) - std::min(size_t(opt.shards), all.size() - k));
    i = std::min({i, prev + 1, size_t(opt.shards - 1)});
    prev = i;
    writers[i].add(all[k].name, all[k].dtype, all[k].shape, all[k].fill);
    weight_map[all[k].name] = files[i];
    before += all[k].bytes;
  }
  uint64_t done = 0;
  for (size_t i = 0; i < writers.size(); ++i) {
    std::function<void(uint64_t, uint64_t)> prog;
    if (opt.progress) prog = [&](uint64_t d, uint64_t) { opt.progress(done + d, total); };
    writers[i].write(dir / files[i], prog);
    done += writers[i].data_bytes();
  }
  if (opt.shards > 1) {
    nlohmann::json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::trunc);
    out << idx.dump(2) << "\n";
    M3_CHECK(out.good(), "{}: write failed", (dir / "model.safetensors.index.json").string());
  }
  return total;
}

}  // namespace m3
