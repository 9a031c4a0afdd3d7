// Synthetic checkpoints: presets, the counter-based normal generator, and the writer.
// NOTE: values come from a hash of (seed, tensor name, element index) rather than a sequential
// RNG stream, so a tensor's values do not depend on which other tensors exist or their order;
// tests can regenerate any single tensor.
#include "model/synthetic.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "core/check.h"
#include "core/codecs.h"
#include "model/load_weights.h"
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

}  // namespace

void synthetic_values(const WeightEntry& e, const SyntheticOptions& opt, float* out) {
  normals(name_key(opt.seed, e.names[0]), entry_std(e, opt), e.dtype, count(e.shape), out);
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
    cfg << model_spec_to_json(spec, opt.config_spelling, true);
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
