// The Python extension `m3mono._m3mono` (nanobind; python/m3mono/__init__.py wraps it): an Engine
// over a checkpoint directory (the backend `generate` / `serve` choose: cli/backend_choice.h), its
// tokenizer when the checkpoint has one, and make_tiny / info. m3::Error arrives in Python as
// m3mono.Error (a ValueError) with the same message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include "cli/backend_choice.h"
#include "cli/speculative_args.h"
#include "core/check.h"
#include "core/parallel.h"
#include "model/prepare.h"
#include "model/prepared_tensors.h"
#include "model/safetensors.h"
#include "model/weight_table.h"
#include "runtime/communicator.h"
#include "ref/layers.h"
#include "model/spec.h"
#include "model/synthetic.h"
#include "model/synthetic_eagle3.h"
#include "runtime/generate.h"
#include "text/tiny_files.h"
#include "text/tokenizer.h"
#if M3_WITH_CUDA
#include <cuda_runtime.h>

#include "native/cuda_check.h"
#include "mono/mono.h"
#include "mono/options.h"
#include "native/device_comm.h"
#include "native/device_layers.h"
#include "native/prepared.h"
#endif

namespace nb = nanobind;
using namespace m3;

namespace {

class Engine {
 public:
  Engine(const std::string& model_dir, const std::string& device, int tp, bool mono, int threads, int max_model_len,
         const std::string& tp_comm, const std::string& speculative, const std::string& draft_model,
         int num_draft_tokens, const std::string& draft_device)
      : dir_(model_dir) {
    M3_CHECK(std::filesystem::is_directory(model_dir), "LLM: model {} is not a directory", model_dir);
    spec_ = load_model_spec(model_dir);
    int len = max_model_len > 0 ? max_model_len : 4096;
    if (spec_.max_positions > 0) len = std::min(len, spec_.max_positions);
    M3_CHECK(len >= 2, "LLM: max_model_len {} (at least 2)", len);
    max_len_ = len;
    cli::BackendChoice c{device, "checkpoint", threads, (len + spec_.index_block - 1) / spec_.index_block, len};
    c.mono = mono;
    c.tp = tp;
    c.tp_comm = tp_comm;
    cli::SpeculativeArgs sa;
    sa.method = speculative;
    sa.draft_model = draft_model;
    sa.num_draft_tokens = num_draft_tokens;
    sa.draft_device = draft_device;
    spec_opt_ = cli::speculative_options(sa, "LLM", model_dir, spec_,
                                         device == "cuda" || (device == "auto" && cli::cuda_usable()));
    backend_ = cli::make_chosen_backend(c, model_dir, spec_, "LLM");
    M3_CHECK(spec_opt_.method != SpeculativeMethod::Eagle3 || backend_->returns_aux(),
             "LLM: speculative eagle3 needs the target's hidden states, which the {} backend does not return (the "
             "CPU reference and the single-GPU CUDA backend do)", backend_->name());
    const auto tok = std::filesystem::path(model_dir) / "tokenizer.json";
    if (std::filesystem::exists(tok)) tokenizer_ = text::Tokenizer::load(tok.string(), spec_.vocab_size);
  }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int max_tokens, float temperature, int top_k,
                                float top_p, uint64_t seed, bool stop_at_eos) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams{temperature, top_k, top_p, seed};
    r.seed = seed;
    r.stop_id = stop_at_eos ? spec_.eos_id : -1;
    r.speculative = spec_opt_;
    M3_CHECK(generate_positions(r) <= max_len_, "LLM: {} prompt tokens + {} new tokens exceed max_model_len {}",
             prompt.size(), max_tokens, max_len_);
    GenerateResult g;
    {
      nb::gil_scoped_release release;  // the step loop holds no Python object
      g = m3::generate(*backend_, r);
    }
    last_ = {{"verify_steps", g.verify_steps}, {"drafted", g.drafted}, {"accepted", g.accepted}};  // GIL held
    return std::move(g.ids);
  }
  // Speculative decoding counts of the last generate (verify steps, drafts scored, drafts kept).
  std::map<std::string, int> speculative_stats() const { return last_; }
  std::vector<int32_t> encode(const std::string& text) const { return tok().encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const { return tok().decode(ids, true); }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  std::string name() const { return backend_->name(); }
  int vocab_size() const { return spec_.vocab_size; }
  int max_model_len() const { return max_len_; }
  int eos_id() const { return spec_.eos_id; }

 private:
  const text::Tokenizer& tok() const {
    M3_CHECK(tokenizer_.has_value(), "LLM: {} has no tokenizer.json: give prompts as token ids", dir_);
    return *tokenizer_;
  }
  std::string dir_;
  ModelSpec spec_;
  int max_len_ = 0;
  SpeculativeOptions spec_opt_;
  std::map<std::string, int> last_;
  std::unique_ptr<Backend> backend_;
  std::optional<text::Tokenizer> tokenizer_;
};

std::string make_tiny(const std::string& out, const std::string& preset, uint64_t seed, bool eagle3) {
  M3_CHECK(synthetic_preset_writable(preset), "make_tiny: preset '{}' is spec-only", preset);
  const ModelSpec spec = synthetic_preset(preset);
  SyntheticOptions opt;
  opt.seed = seed;
  write_synthetic_checkpoint(out, spec, opt);
  text::write_tiny_text_files(out, spec.vocab_size, spec.bos_id, spec.eos_id);
  if (eagle3) {  // a synthetic EAGLE3 draft in OUT/eagle3 (as `m3mono make-tiny --eagle3`)
    SyntheticEagle3Options eo;
    eo.seed = seed;
    write_synthetic_eagle3(std::filesystem::path(out) / "eagle3", spec, eo);
  }
  return out;
}

std::map<std::string, int64_t> info(const std::string& model_dir) {
  const ModelSpec s = load_model_spec(model_dir);
  return {{"num_layers", s.num_layers},         {"sparse_layers", s.num_sparse_layers()},
          {"moe_layers", s.num_moe_layers()},   {"hidden_size", s.hidden},
          {"num_attention_heads", s.num_heads}, {"num_key_value_heads", s.num_kv_heads},
          {"head_dim", s.head_dim},             {"num_experts", s.num_experts},
          {"experts_per_token", s.top_k},       {"vocab_size", s.vocab_size},
          {"max_position_embeddings", s.max_positions}, {"index_block_size", s.index_block},
          {"index_head_dim", s.index_dim}};
}

// ---- the library level (issue 16): the prepared layout as named tensors, and borrowing them ----

// The prepared arena's layout of one rank of a checkpoint (no weights read).
class Layout {
 public:
  Layout(const std::string& model_dir, int tp_rank, int tp_size, const std::string& router_dtype) {
    M3_CHECK(router_dtype == "float32" || router_dtype == "bfloat16",
             "Layout: router_dtype must be float32 or bfloat16, got '{}'", router_dtype);
    M3_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "Layout: rank {} of {}", tp_rank, tp_size);
    PrepareOptions po;
    po.tp_rank = tp_rank;
    po.tp_size = tp_size;
    po.router_bf16 = router_dtype == "bfloat16";
    dir_ = model_dir;
    const ModelSpec spec = load_model_spec(model_dir);
    po = prepare_options_for(model_dir, spec, po);  // as the GPU loader lays it out (MXFP8 projections)
    layout_ = plan_prepared(spec, po);
    rank_spec_ = prepared_rank_spec(layout_, tp_rank, tp_size, "Layout");
  }
  const PreparedLayout& layout() const { return layout_; }
  const ModelSpec& rank_spec() const { return rank_spec_; }  // the shapes the rank computes with
  const std::string& dir() const { return dir_; }
  int num_layers() const { return int(layout_.layers.size()); }
  static nb::list describe(const std::vector<TensorSpec>& v) {
    nb::list out;
    for (const TensorSpec& t : v) {
      nb::dict d;
      d["name"] = t.name;
      d["dtype"] = std::string(dtype_name(t.dtype));
      d["storage"] = t.elem_bytes == 4 ? "float32" : t.elem_bytes == 2 ? "bfloat16" : "uint8";
      d["shape"] = nb::tuple(nb::cast(t.shape));
      out.append(d);
    }
    return out;
  }
  nb::list layer_tensors(int layer) const { return describe(layer_tensor_specs(layout_, layer)); }
  nb::list model_tensors() const { return describe(model_tensor_specs(layout_)); }

 private:
  std::string dir_;
  PreparedLayout layout_;
  ModelSpec rank_spec_;
};

// The prepared arena of the layout's rank filled on the host from its checkpoint, as numpy arrays
// (views of one host buffer that the arrays keep alive; BF16 words as uint16): what a framework
// would hold if it had loaded the weights itself. {"model": {name: array}, "layers": [{name: array}]}.
nb::dict prepared_arrays(const Layout& lay) {
  const PreparedLayout& L = lay.layout();
  SafetensorsSet files = SafetensorsSet::open(lay.dir());
  WeightTable table = build_checkpoint_table(L.spec, files, lay.dir());
  WeightBinding bind = bind_weights(table, files);
  auto src = make_weight_source(bind);
  auto* arena = new std::vector<uint8_t>(L.total_bytes, 0);
  nb::capsule owner(arena, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  uint8_t* base = arena->data();
  M3_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, "prepared_arrays: the host arena is not 16-byte aligned");
  {
    HostArenaSink sink(*arena);
    ThreadPool pool(0);
    nb::gil_scoped_release release;
    fill_prepared(L, *src, sink, pool);
  }
  auto array = [&](const TensorSpec& t) -> nb::object {
    std::vector<size_t> shape(t.shape.begin(), t.shape.end());
    void* p = base + t.offset;
    if (t.elem_bytes == 4)
      return nb::cast(nb::ndarray<nb::numpy, float>(p, shape.size(), shape.data(), owner));
    if (t.elem_bytes == 2)
      return nb::cast(nb::ndarray<nb::numpy, uint16_t>(p, shape.size(), shape.data(), owner));
    return nb::cast(nb::ndarray<nb::numpy, uint8_t>(p, shape.size(), shape.data(), owner));
  };
  nb::dict out, model;
  for (const TensorSpec& t : model_tensor_specs(L)) model[t.name.c_str()] = array(t);
  nb::list layers;
  for (int l = 0; l < int(L.layers.size()); ++l) {
    nb::dict d;
    for (const TensorSpec& t : layer_tensor_specs(L, l)) d[t.name.c_str()] = array(t);
    layers.append(d);
  }
  out["model"] = model;
  out["layers"] = layers;
  return out;
}

// One layer's tensors borrowed from the caller: every tensor the layer's layout has, each checked
// (check_borrowed: element type, shape, compact strides, alignment, device) and kept alive as long
// as this object; nothing converted or copied (data_ptr(name) is the caller's buffer).
class LayerSpec {
 public:
  LayerSpec(const Layout& lay, int layer, nb::dict tensors, const std::string& device) {
    M3_CHECK(device == "cpu" || device == "cuda", "LayerSpec: device must be cpu or cuda, got '{}'", device);
    M3_CHECK(layer >= -1 && layer < lay.num_layers(), "LayerSpec: layer {} of a model of {} layers (-1: the model's "
             "embedding, lm_head and final norm)", layer, lay.num_layers());
    layer_ = layer;
    layout_ = &lay.layout();
    const std::vector<TensorSpec> specs =
        layer < 0 ? model_tensor_specs(lay.layout()) : layer_tensor_specs(lay.layout(), layer);
    std::vector<std::string> names;
    for (const TensorSpec& s : specs) {
      names.push_back(s.name);
      M3_CHECK(tensors.contains(s.name.c_str()), "LayerSpec: layer {}: tensor '{}' is missing ({})", layer, s.name,
               s.describe());
      nb::object obj = tensors[s.name.c_str()];
      nb::ndarray<nb::ro> a;
      M3_CHECK(nb::try_cast(obj, a), "LayerSpec: layer {}: '{}' is a {}, not an array (DLPack or the buffer protocol)",
               layer, s.name, nb::type_name(obj.type()).c_str());
      BorrowedTensor b;
      b.data = a.data();
      const nb::dlpack::dtype dt = a.dtype();
      M3_CHECK(dt.lanes == 1, "LayerSpec: layer {}: '{}' has {} lanes", layer, s.name, dt.lanes);
      switch (nb::dlpack::dtype_code(dt.code)) {
        case nb::dlpack::dtype_code::UInt: b.kind = ElemKind::UInt; break;
        case nb::dlpack::dtype_code::Int: b.kind = ElemKind::Int; break;
        case nb::dlpack::dtype_code::Float: b.kind = ElemKind::Float; break;
        case nb::dlpack::dtype_code::Bfloat: b.kind = ElemKind::BFloat; break;
        case nb::dlpack::dtype_code::Float8_E4M3FN: b.kind = ElemKind::Float8E4M3; break;
        default: M3_FAIL("LayerSpec: layer {}: '{}' has DLPack type code {}: not an element type the arena stores",
                         layer, s.name, int(dt.code));
      }
      b.bits = dt.bits;
      for (size_t i = 0; i < a.ndim(); ++i) {
        b.shape.push_back(int64_t(a.shape(i)));
        b.strides.push_back(int64_t(a.stride(i)));
      }
      b.on_cpu = a.device_type() == nb::device::cpu::value;
      b.device = b.on_cpu ? -1 : int(a.device_id());
      const std::string why = check_borrowed(s, b, device == "cpu");
      M3_CHECK(why.empty(), "LayerSpec: layer {}: {}", layer, why);
      ptrs_.emplace_back(s.name, reinterpret_cast<uintptr_t>(b.data));
      borrowed_.emplace_back(s, b.data);
      device_ = device;
      keep_.push_back(obj);
    }
    for (auto [k, v] : tensors) {
      const std::string name = nb::cast<std::string>(k);
      M3_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
               "LayerSpec: layer {}: '{}' is not a tensor of this layer (it has: {})", layer, name,
               fmt::format("{}", fmt::join(names, ", ")));
    }
  }
  int layer() const { return layer_; }
  const ref::BorrowedLayer& borrowed() const { return borrowed_; }
  const PreparedLayout* layout() const { return layout_; }
  const std::string& device() const { return device_; }
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const auto& [n, p] : ptrs_) v.push_back(n);
    return v;
  }
  uintptr_t data_ptr(const std::string& name) const {
    for (const auto& [n, p] : ptrs_)
      if (n == name) return p;
    M3_FAIL("LayerSpec: layer {} has no tensor '{}'", layer_, name);
  }

 private:
  int layer_ = 0;
  const PreparedLayout* layout_ = nullptr;  // the Layout's (NativeLayers checks it is one layout)
  std::string device_;
  std::vector<std::pair<std::string, uintptr_t>> ptrs_;
  ref::BorrowedLayer borrowed_;
  std::vector<nb::object> keep_;  // the borrowed arrays, alive as long as this spec
};

// A new numpy array owning its values.
nb::object numpy_of(std::vector<float> v, std::vector<size_t> shape) {
  auto* owned = new std::vector<float>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, float>(owned->data(), shape.size(), shape.data(), owner));
}

// Every layer's paged caches, borrowed from the caller: on the CPU reference fp32 arrays per layer
// {"k": [slots, kv_dim], "v": [slots, kv_dim], "ik": [slots, index_dim] (sparse layers)}, slots =
// num_blocks x the model's block size; each checked (element type, shape, compact, host, writable)
// and kept alive as long as this spec, never converted (a converted copy would take the writes).
class CacheSpec {
 public:
  CacheSpec(const Layout& lay, int num_blocks, nb::list caches, const std::string& device) {
    const ModelSpec& s = lay.rank_spec();  // this rank's K/V heads
    M3_CHECK(device == "cpu" || device == "cuda", "CacheSpec: device must be cpu or cuda, got '{}'", device);
    M3_CHECK(num_blocks > 0, "CacheSpec: num_blocks {} (> 0)", num_blocks);
    M3_CHECK(int(nb::len(caches)) == s.num_layers, "CacheSpec: caches for {} layers, the model has {}",
             nb::len(caches), s.num_layers);
    layout_ = &lay.layout();
    num_blocks_ = num_blocks;
    device_ = device;
    const bool gpu = device == "cuda";
    const int64_t slots = int64_t(num_blocks) * s.index_block;
    for (int l = 0; l < s.num_layers; ++l) {
      nb::dict d;
      M3_CHECK(nb::try_cast(caches[l], d), "CacheSpec: caches[{}] is not a dict of 'k', 'v'{}", l,
               s.sparse(l) ? ", 'ik'" : "");
      auto take = [&](const char* name, int64_t width) -> void* {
        M3_CHECK(d.contains(name), "CacheSpec: caches[{}] has no '{}'", l, name);
        nb::object o = d[name];
        nb::ndarray<> a;  // no constraints: nothing may convert
        const bool arr = nb::try_cast(o, a, false);
        const bool shape_ok = arr && a.ndim() == 2 && int64_t(a.shape(0)) == slots && int64_t(a.shape(1)) == width &&
                              a.stride(1) == 1 && int64_t(a.stride(0)) == width;
        if (!gpu) {
          M3_CHECK(shape_ok && a.dtype() == nb::dtype<float>() && a.device_type() == nb::device::cpu::value,
                   "CacheSpec: caches[{}]['{}'] must be a writable C-contiguous float32 host array [{}, {}] "
                   "(num_blocks x block_size rows): refused, not converted", l, name, slots, width);
        } else {
          // FP8 E4M3 codes (uint8 or float8_e4m3fn) or BF16, one type per cache kind
          const nb::dlpack::dtype dt = arr ? a.dtype() : nb::dlpack::dtype{};
          const bool fp8 = dt.lanes == 1 && dt.bits == 8 &&
                           (dt.code == uint8_t(nb::dlpack::dtype_code::UInt) ||
                            dt.code == uint8_t(nb::dlpack::dtype_code::Float8_E4M3FN));
          const bool bf16 = dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat);
          M3_CHECK(shape_ok && (fp8 || bf16) && a.device_type() == nb::device::cuda::value,
                   "CacheSpec: caches[{}]['{}'] must be a C-contiguous CUDA array [{}, {}] (num_blocks x block_size "
                   "rows) of FP8 E4M3 codes (uint8 or float8_e4m3fn) or bfloat16: refused, not converted", l, name,
                   slots, width);
          const DType t = fp8 ? DType::F8_E4M3 : DType::BF16;
          DType& kind = std::string(name) == "ik" ? ik_dtype_ : kv_dtype_;
          M3_CHECK(kind == DType::U8 || kind == t, "CacheSpec: caches[{}]['{}'] is {}, the other {} caches are {}", l,
                   name, dtype_name(t), std::string(name) == "ik" ? "index-K" : "K/V", dtype_name(kind));
          kind = t;
          M3_CHECK(device_id_ < 0 || device_id_ == int(a.device_id()),
                   "CacheSpec: caches[{}]['{}'] is on GPU {}, the others on GPU {}", l, name, a.device_id(), device_id_);
          device_id_ = int(a.device_id());
        }
        keep_.push_back(o);
        return a.data();
      };
      k_.push_back(take("k", s.kv_dim()));
      v_.push_back(take("v", s.kv_dim()));
      ik_.push_back(s.sparse(l) ? take("ik", s.index_dim) : nullptr);
      if (!s.sparse(l))
        M3_CHECK(!d.contains("ik"), "CacheSpec: caches[{}] has an 'ik' but layer {} is a full-attention layer", l, l);
      // FP8 scales (stored value x scale), 1 by default
      std::array<float, 3> sc{1.f, 1.f, 1.f};
      const char* sn[3] = {"k_scale", "v_scale", "ik_scale"};
      for (int i = 0; i < 3; ++i)
        if (d.contains(sn[i])) {
          M3_CHECK(gpu, "CacheSpec: caches[{}]['{}']: the CPU reference's fp32 caches take no scale", l, sn[i]);
          sc[size_t(i)] = nb::cast<float>(d[sn[i]]);
        }
      scales_.push_back(sc);
    }
  }
  const PreparedLayout* layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  const std::string& device() const { return device_; }
  int device_id() const { return device_id_; }
  DType kv_dtype() const { return kv_dtype_; }
  DType ik_dtype() const { return ik_dtype_ == DType::U8 ? DType::F8_E4M3 : ik_dtype_; }
  const std::vector<std::array<float, 3>>& scales() const { return scales_; }
  std::vector<float*> k() const { return as_f32(k_); }
  std::vector<float*> v() const { return as_f32(v_); }
  std::vector<float*> ik() const { return as_f32(ik_); }
  const std::vector<void*>& k_raw() const { return k_; }
  const std::vector<void*>& v_raw() const { return v_; }
  const std::vector<void*>& ik_raw() const { return ik_; }

 private:
  static std::vector<float*> as_f32(const std::vector<void*>& p) {
    std::vector<float*> f;
    for (void* q : p) f.push_back(static_cast<float*>(q));
    return f;
  }
  const PreparedLayout* layout_ = nullptr;
  int num_blocks_ = 0, device_id_ = -1;
  std::string device_;
  DType kv_dtype_ = DType::U8, ik_dtype_ = DType::U8;  // U8: not seen yet
  std::vector<void*> k_, v_, ik_;
  std::vector<std::array<float, 3>> scales_;
  std::vector<nb::object> keep_;
};

// Tensor-parallel ranks as threads of this process (runtime/communicator.h LocalGroup): rank(r)
// hands out rank r's context once; each rank's NativeLayers runs on its own Python thread (the
// layer calls release the GIL), every rank calling the same methods in the same order.
class TPGroup {
 public:
  TPGroup(int size, double timeout_s) {
    M3_CHECK(size >= 1 && size <= 64, "TPGroup: size {} (1 .. 64)", size);
    M3_CHECK(timeout_s > 0 && timeout_s <= 86400, "TPGroup: timeout_s {} (> 0, at most a day)", timeout_s);
    group_ = std::make_unique<LocalGroup>(size, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  }
  int size() const { return group_->size(); }
  std::shared_ptr<Communicator> rank(int r) { return std::shared_ptr<Communicator>(group_->rank(r)); }

 private:
  std::unique_ptr<LocalGroup> group_;
};
struct TPContext {
  std::shared_ptr<Communicator> comm;
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
};

// The layers over borrowed tensors and caches: the CPU reference's (ref/layers.h) for device "cpu",
// the native GPU path's (native/device_layers.h) for "cuda". The specs and the cache arrays are
// kept alive as long as this object. On the GPU every call is enqueued on `stream` (a CUDA stream
// handle as an int, e.g. torch.cuda.current_stream().cuda_stream; 0: the default stream) and the
// residual stream, the embeddings and the logits are float32 CUDA arrays the caller owns.
using F32Array = nb::ndarray<float, nb::c_contig>;
class NativeLayers {
 public:
  virtual ~NativeLayers() = default;
  NativeLayers(const Layout& lay, nb::object model, nb::list layers, const CacheSpec& caches, int threads,
               const TPContext* tp, int max_tokens, int max_model_len, const std::string& tp_comm = "auto") {
    const PreparedLayout& L = lay.layout();
    const ModelSpec& s = L.spec;
    const LayerSpec& m = nb::cast<const LayerSpec&>(model);
    M3_CHECK(m.layer() == -1 && m.layout() == &L, "NativeLayers: `model` must be the LayerSpec(layout, -1, ...) of "
             "this layout (the embedding, lm_head and final norm)");
    gpu_ = m.device() == "cuda";
    M3_CHECK(int(nb::len(layers)) == s.num_layers, "NativeLayers: {} layer specs for a model of {} layers",
             nb::len(layers), s.num_layers);
    std::vector<ref::BorrowedLayer> per;
    for (int l = 0; l < s.num_layers; ++l) {
      const LayerSpec& x = nb::cast<const LayerSpec&>(layers[l]);
      M3_CHECK(x.layer() == l && x.layout() == &L && x.device() == m.device(),
               "NativeLayers: layers[{}] is the spec of layer {} (of {} layout, device {}; the model's: {})", l,
               x.layer(), x.layout() == &L ? "this" : "another", x.device(), m.device());
      per.push_back(x.borrowed());
    }
    M3_CHECK(caches.layout() == &L, "NativeLayers: the CacheSpec is of another Layout");
    M3_CHECK(caches.device() == m.device(), "NativeLayers: the caches are on {}, the weights on {}", caches.device(),
             m.device());
    keep_.push_back(model);
    keep_.push_back(layers);
    if (!gpu_) {
      nb::gil_scoped_release release;  // the other ranks' threads build theirs meanwhile
      rl_ = std::make_unique<ref::RefLayers>(L, m.borrowed(), std::move(per), caches.num_blocks(), caches.k(),
                                             caches.v(), caches.ik(), threads, tp ? tp->comm : nullptr);
      return;
    }
#if M3_WITH_CUDA
    device_ = caches.device_id();
    M3_CUDA_CHECK(cudaSetDevice(device_));
    std::shared_ptr<native::DeviceComm> comm;
    if (tp && tp->size() > 1) comm = device_comm(*tp, lay, tp_comm);
    std::vector<std::pair<TensorSpec, const void*>> all(m.borrowed().begin(), m.borrowed().end());
    for (const auto& t : per) all.insert(all.end(), t.begin(), t.end());
    for (const auto& [spec, p] : all) {
      if (!p || spec.bytes == 0) continue;
      cudaPointerAttributes pa{};
      M3_CUDA_CHECK(cudaPointerGetAttributes(&pa, p));
      M3_CHECK(pa.device == device_, "NativeLayers: tensor '{}' is on GPU {}, the caches on GPU {}", spec.name,
               pa.device, device_);
    }
    auto weights = std::shared_ptr<const native::PreparedWeights>(native::PreparedWeights::borrow(L, all));
    const ModelSpec& rs = lay.rank_spec();
    auto shape = native::kv_cache_shape(rs, caches.num_blocks(), caches.kv_dtype(), caches.ik_dtype());
    auto cache = std::make_unique<native::DeviceKvCache>(shape, caches.k_raw(), caches.v_raw(), caches.ik_raw());
    for (int l = 0; l < rs.num_layers; ++l) {
      const auto& sc = caches.scales()[size_t(l)];
      cache->set_scales(l, sc[0], sc[1], sc[2]);
    }
    const int len = max_model_len > 0 ? max_model_len : caches.num_blocks() * rs.index_block;
    dl_ = std::make_unique<native::DeviceLayers>(std::move(weights), std::move(cache), max_tokens, len, std::move(comm));
#else
    (void)max_tokens, (void)max_model_len, (void)tp_comm;
    M3_FAIL("NativeLayers: device cuda: this build has no CUDA (built without nvcc)");
#endif
  }
  // seqs: (start_pos, [token ids], [block table]) or with a 4th item all_logits
  void prepare_step(nb::list seqs, uintptr_t stream) {
    live("prepare_step");
    StepBatch b;
    for (nb::handle h : seqs) {
      nb::tuple t = nb::cast<nb::tuple>(h);
      M3_CHECK(nb::len(t) == 3 || nb::len(t) == 4,
               "{}.prepare_step: a sequence is (start_pos, tokens, block_table[, all_logits])", name_);
      SeqStep q;
      q.start_pos = nb::cast<int32_t>(t[0]);
      q.tokens = nb::cast<std::vector<int32_t>>(t[1]);
      q.block_table = nb::cast<std::vector<int32_t>>(t[2]);
      q.all_logits = nb::len(t) == 4 && nb::cast<bool>(t[3]);
      b.seqs.push_back(std::move(q));
    }
    if (!gpu_) return rl_->prepare_step(b);
#if M3_WITH_CUDA
    M3_CUDA_CHECK(cudaSetDevice(device_));
    nb::gil_scoped_release release;
    dl_->prepare_step(b, cuda_stream(stream));
#endif
  }
  int num_tokens() const {
    live("num_tokens");
    return gpu_ ? gpu_tokens() : rl_->plan().num_tokens;
  }
  int num_out_rows() const {
    live("num_out_rows");
    return gpu_ ? gpu_out_rows() : int(rl_->plan().out_tokens.size());
  }
  int hidden() const {
    live("hidden");
    return spec().hidden;
  }
  int vocab_size() const {
    live("vocab_size");
    return spec().vocab_size;
  }
  bool closed() const { return closed_; }
  // Waits for this object's work on the device, then releases its scratch and the borrowed
  // arrays; idempotent. Any later call raises.
  void close() {
    if (closed_) return;
    closed_ = true;
    {
      nb::gil_scoped_release release;
#if M3_WITH_CUDA
      if (dl_) {
        M3_CUDA_CHECK(cudaSetDevice(device_));
        cudaDeviceSynchronize();
        dl_.reset();
      }
#endif
      rl_.reset();
    }
    keep_.clear();
  }
  std::string device() const { return gpu_ ? "cuda" : "cpu"; }

  nb::object embed(std::optional<F32Array> out, uintptr_t stream) {
    live("embed");
    const int H = spec().hidden;
    if (!gpu_) {
      M3_CHECK(!out, "{}.embed: on the CPU it returns a new array (no `out`)", name_);
      std::vector<float> x = rl_->embed();
      const size_t T = x.size() / size_t(H);
      return numpy_of(std::move(x), {T, size_t(H)});
    }
    M3_CHECK(out.has_value(), "{}.embed: on the GPU pass `out`, a float32 CUDA array [{}, {}]", name_, num_tokens(), H);
    check_2d(*out, "out", num_tokens(), H);
#if M3_WITH_CUDA
    M3_CUDA_CHECK(cudaSetDevice(device_));
    {
      nb::gil_scoped_release release;
      dl_->embed(out->data(), cuda_stream(stream));
    }
#endif
    return nb::none();  // written into `out`
  }
  void forward_layer(int layer, F32Array x, uintptr_t stream) {
    live("forward_layer");
    M3_CHECK(0 <= layer && layer < spec().num_layers, "{}.forward_layer: layer {} of {}", name_, layer,
             spec().num_layers);
    forward_layers(layer, layer + 1, x, stream);
  }
  // layers [first, last) in order (the contiguous range a runner takes; mono's forward_layers)
  void forward_layers(int first, int last, F32Array x, uintptr_t stream) {
    live("forward_layers");
    check_2d(x, "x", num_tokens(), spec().hidden);
    M3_CHECK(0 <= first && first <= last && last <= spec().num_layers,
             "{}.forward_layers: [{}, {}) is not a range of the model's {} layers", name_, first, last,
             spec().num_layers);
    if (!gpu_) {
      nb::gil_scoped_release release;
      for (int l = first; l < last; ++l) rl_->forward_layer(l, x.data());
      return;
    }
#if M3_WITH_CUDA
    M3_CUDA_CHECK(cudaSetDevice(device_));
    nb::gil_scoped_release release;
    dl_->forward_layers(first, last, x.data(), cuda_stream(stream));
#endif
  }
  nb::object logits(F32Array x, std::optional<F32Array> out, uintptr_t stream) {
    live("logits");
    check_2d(x, "x", num_tokens(), spec().hidden);
    const size_t V = size_t(spec().vocab_size);
    if (!gpu_) {
      M3_CHECK(!out, "{}.logits: on the CPU it returns a new array (no `out`)", name_);
      std::vector<float> o;
      {
        nb::gil_scoped_release release;  // a collective: the other ranks' threads must run
        o = rl_->logits(x.data());
      }
      return numpy_of(std::move(o), {o.size() / V, V});
    }
    M3_CHECK(out.has_value(), "{}.logits: on the GPU pass `out`, a float32 CUDA array [{}, {}]", name_,
             num_out_rows(), V);
    check_2d(*out, "out", num_out_rows(), int(V));
#if M3_WITH_CUDA
    M3_CUDA_CHECK(cudaSetDevice(device_));
    {
      nb::gil_scoped_release release;
      dl_->logits(x.data(), out->data(), cuda_stream(stream));
    }
#endif
    return nb::none();  // written into `out`
  }

 protected:
  const ModelSpec& spec() const {
#if M3_WITH_CUDA
    if (gpu_) return dl_->spec();
#endif
    return rl_->spec();
  }
#if M3_WITH_CUDA
  static cudaStream_t cuda_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }
  // The GPU ranks' collectives over the group's host communicator: NCCL ("nccl"; "auto" when this
  // build has it and every rank has a GPU of its own) or host-staged ("host": ranks may share a GPU;
  // it synchronizes the stream, so no graph capture). Collective: every rank learns every rank's GPU
  // first, so every rank makes the same choice.
  std::shared_ptr<native::DeviceComm> device_comm(const TPContext& tp, const Layout& lay, const std::string& how) {
    const PreparedLayout& L = lay.layout();
    M3_CHECK(tp.rank() == L.opt.tp_rank && tp.size() == L.opt.tp_size,
             "NativeLayers: the TPContext is rank {} of {}, the Layout rank {} of {}", tp.rank(), tp.size(), L.opt.tp_rank,
             L.opt.tp_size);
    M3_CHECK(how == "auto" || how == "nccl" || how == "host", "NativeLayers: tp_comm '{}' (auto, nccl or host)", how);
    nb::gil_scoped_release release;  // the other ranks' threads meet here
    std::vector<int32_t> devs(size_t(tp.size()));
    const int32_t mine = device_;
    tp.comm->all_gather(&mine, devs.data(), sizeof(int32_t));
    std::vector<int32_t> d = devs;
    std::sort(d.begin(), d.end());
    const bool own = std::unique(d.begin(), d.end()) == d.end();
    M3_CHECK(how != "nccl" || (own && native::nccl_available()),
             "NativeLayers: tp_comm 'nccl' needs {} (the ranks' GPUs: {})",
             native::nccl_available() ? "a GPU of its own for every rank" : "a build with NCCL", fmt::join(devs, ", "));
    if (how == "nccl" || (how == "auto" && own && native::nccl_available())) return native::make_nccl_comm(*tp.comm);
    return native::make_host_staged_comm(tp.comm);
  }
  int gpu_tokens() const { return dl_->num_tokens(); }
  int gpu_out_rows() const { return dl_->num_out_rows(); }
#else
  int gpu_tokens() const { return 0; }
  int gpu_out_rows() const { return 0; }
#endif
  void live(const char* what) const {
    M3_CHECK(!closed_, "{}.{}: closed (create a new one)", name_, what);
  }
  // a float32 C-contiguous [rows, cols] array on this object's device
  void check_2d(const F32Array& a, const char* name, int rows, int cols) const {
    const bool on_dev = a.device_type() == (gpu_ ? nb::device::cuda::value : nb::device::cpu::value) &&
                        (!gpu_ || int(a.device_id()) == device_);
    M3_CHECK(a.ndim() == 2 && int64_t(a.shape(0)) == rows && int64_t(a.shape(1)) == cols && on_dev,
             "{}: `{}` must be a float32 C-contiguous {} array [{}, {}] (got {} dims{}, on {}{})", name_, name,
             gpu_ ? fmt::format("CUDA (GPU {})", device_) : std::string("host"), rows, cols, a.ndim(),
             a.ndim() == 2 ? fmt::format(" [{}, {}]", a.shape(0), a.shape(1)) : std::string(),
             a.device_type() == nb::device::cpu::value ? "the host" : "a GPU",
             a.device_type() == nb::device::cpu::value ? "" : fmt::format(" {}", a.device_id()));
  }
  bool gpu_ = false, closed_ = false;
  int device_ = -1;
  const char* name_ = "NativeLayers";
  std::unique_ptr<ref::RefLayers> rl_;
#if M3_WITH_CUDA
  std::unique_ptr<native::DeviceLayers> dl_;
#endif
  std::vector<nb::object> keep_;
};

// The mono path over the same borrowed specs (issue 16's Mono): NativeLayers' calls, with the
// layers of the model's sparse range run by the fused persistent kernel (mono/mono.h) and the rest
// natively, bitwise what NativeLayers gives. It serves decode steps (at most 4 sequences of 1 .. 4
// query tokens, all of one length); prepare_step refuses any other naming why. Creation refuses
// (m3mono.Error with every reason) what mono cannot run (a weight format, a cache format, the
// GPU's co-residency). Beyond NativeLayers' scratch it allocates only its task tables and counters
// (per step shape and layer range, at the first eager call of each: run one step eagerly before
// capturing a CUDA graph of it).
class Mono : public NativeLayers {
 public:
  Mono(const Layout& lay, nb::object model, nb::list layers, const CacheSpec& caches, const TPContext* tp,
       int max_model_len, const std::string& options)
      : NativeLayers(cuda_only(lay, model, tp), model, layers, caches, 0, tp, kMonoTokens, max_model_len) {
#if M3_WITH_CUDA
    const mono::MonoOptions opt = mono::parse_options(options);
    M3_CUDA_CHECK(cudaSetDevice(device_));
    auto made = mono::create(dl_->model(), opt);
    if (auto* r = std::get_if<mono::Refusal>(&made)) {
      close();
      M3_FAIL("Mono: {}", r->text());
    }
    auto& runner = std::get<std::unique_ptr<mono::MonoRunner>>(made);
    mono_ = runner.get();
    dl_->set_runner(std::move(runner));
    name_ = "Mono";
#else
    (void)options;
#endif
  }
  std::string describe() const {
    live("describe");
#if M3_WITH_CUDA
    return mono_->describe();
#else
    return "";
#endif
  }

 private:
  static constexpr int kMonoTokens = 16;  // 4 sequences of up to 4 query tokens
  static const Layout& cuda_only(const Layout& lay, nb::object model, const TPContext* tp) {
    const LayerSpec& m = nb::cast<const LayerSpec&>(model);
    M3_CHECK(!tp || tp->size() == 1, "Mono: the fused decode path serves one rank (tensor parallelism: {} ranks); "
             "NativeLayers(tp=...) runs the ranks", tp ? tp->size() : 1);
    M3_CHECK(m.device() == "cuda", "Mono: the fused decode path runs on a CUDA device; these specs are on {} "
             "(NativeLayers runs them there)", m.device());
#if !M3_WITH_CUDA
    M3_FAIL("Mono: this build has no CUDA (built without nvcc)");
#endif
    return lay;
  }
#if M3_WITH_CUDA
  mono::MonoRunner* mono_ = nullptr;
#endif
};

}  // namespace

NB_MODULE(_m3mono, m) {
  m.doc() = "m3mono: MiniMax-M3 inference (the C++ engine; see the m3mono package)";
  static nb::exception<m3::Error> error(m, "Error", PyExc_ValueError);
  nb::class_<Engine>(m, "Engine")
      .def(nb::init<const std::string&, const std::string&, int, bool, int, int, const std::string&, const std::string&,
                    const std::string&, int, const std::string&>(),
           nb::arg("model_dir"), nb::arg("device") = "auto", nb::arg("tp") = 1, nb::arg("mono") = false,
           nb::arg("threads") = 0, nb::arg("max_model_len") = 0, nb::arg("tp_comm") = "auto",
           nb::arg("speculative") = "none", nb::arg("draft_model") = "", nb::arg("num_draft_tokens") = 3,
           nb::arg("draft_device") = "auto")
      .def_prop_ro("speculative_stats", &Engine::speculative_stats)
      .def("generate", &Engine::generate, nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("temperature"),
           nb::arg("top_k"), nb::arg("top_p"), nb::arg("seed"), nb::arg("stop_at_eos"))
      .def("encode", &Engine::encode)
      .def("decode", &Engine::decode)
      .def_prop_ro("has_tokenizer", &Engine::has_tokenizer)
      .def_prop_ro("name", &Engine::name)
      .def_prop_ro("vocab_size", &Engine::vocab_size)
      .def_prop_ro("max_model_len", &Engine::max_model_len)
      .def_prop_ro("eos_id", &Engine::eos_id);
  m.def("make_tiny", &make_tiny, nb::arg("out"), nb::arg("preset") = "tiny", nb::arg("seed") = 1,
        nb::arg("eagle3") = false);
  m.def("info", &info, nb::arg("model_dir"));
  nb::class_<Layout>(m, "Layout")
      .def(nb::init<const std::string&, int, int, const std::string&>(), nb::arg("model_dir"), nb::arg("tp_rank") = 0,
           nb::arg("tp_size") = 1, nb::arg("router_dtype") = "float32")
      .def_prop_ro("num_layers", &Layout::num_layers)
      .def("layer_tensors", &Layout::layer_tensors, nb::arg("layer"))
      .def("model_tensors", &Layout::model_tensors);
  m.def("prepared_arrays", &prepared_arrays, nb::arg("layout"));
  nb::class_<LayerSpec>(m, "LayerSpec")
      .def(nb::init<const Layout&, int, nb::dict, const std::string&>(), nb::arg("layout"), nb::arg("layer"),
           nb::arg("tensors"), nb::arg("device") = "cpu", nb::keep_alive<1, 2>())
      .def_prop_ro("layer", &LayerSpec::layer)
      .def_prop_ro("names", &LayerSpec::names)
      .def("data_ptr", &LayerSpec::data_ptr, nb::arg("name"));
  nb::class_<CacheSpec>(m, "CacheSpec")
      .def(nb::init<const Layout&, int, nb::list, const std::string&>(), nb::arg("layout"), nb::arg("num_blocks"),
           nb::arg("caches"), nb::arg("device") = "cpu", nb::keep_alive<1, 2>())
      .def_prop_ro("num_blocks", &CacheSpec::num_blocks);
  nb::class_<TPContext>(m, "TPContext")
      .def_prop_ro("rank", &TPContext::rank)
      .def_prop_ro("size", &TPContext::size);
  nb::class_<TPGroup>(m, "TPGroup")
      .def(nb::init<int, double>(), nb::arg("size"), nb::arg("timeout_s") = 10.0)
      .def_prop_ro("size", &TPGroup::size)
      .def("rank", [](TPGroup& g, int r) { return TPContext{g.rank(r)}; }, nb::arg("rank"));
  nb::class_<NativeLayers>(m, "NativeLayers")
      .def(nb::init<const Layout&, nb::object, nb::list, const CacheSpec&, int, const TPContext*, int, int,
                    const std::string&>(),
           nb::arg("layout"), nb::arg("model"), nb::arg("layers"), nb::arg("caches"), nb::arg("threads") = 0,
           nb::arg("tp").none() = nb::none(), nb::arg("max_tokens") = 256, nb::arg("max_model_len") = 0,
           nb::arg("tp_comm") = "auto",
           nb::keep_alive<1, 2>(), nb::keep_alive<1, 5>())
      .def("prepare_step", &NativeLayers::prepare_step, nb::arg("seqs"), nb::arg("stream") = 0)
      .def_prop_ro("num_tokens", &NativeLayers::num_tokens)
      .def_prop_ro("num_out_rows", &NativeLayers::num_out_rows)
      .def_prop_ro("hidden", &NativeLayers::hidden)
      .def_prop_ro("vocab_size", &NativeLayers::vocab_size)
      .def_prop_ro("device", &NativeLayers::device)
      .def("embed", &NativeLayers::embed, nb::arg("out").noconvert().none() = nb::none(), nb::arg("stream") = 0)
      .def("forward_layer", &NativeLayers::forward_layer, nb::arg("layer"), nb::arg("x").noconvert(),
           nb::arg("stream") = 0)
      .def("forward_layers", &NativeLayers::forward_layers, nb::arg("first"), nb::arg("last"), nb::arg("x").noconvert(),
           nb::arg("stream") = 0)
      .def("logits", &NativeLayers::logits, nb::arg("x").noconvert(), nb::arg("out").noconvert().none() = nb::none(),
           nb::arg("stream") = 0)
      .def("close", &NativeLayers::close)
      .def_prop_ro("closed", &NativeLayers::closed);
  nb::class_<Mono, NativeLayers>(m, "Mono")
      .def(nb::init<const Layout&, nb::object, nb::list, const CacheSpec&, const TPContext*, int, const std::string&>(),
           nb::arg("layout"), nb::arg("model"), nb::arg("layers"), nb::arg("caches"), nb::arg("tp").none() = nb::none(),
           nb::arg("max_model_len") = 0, nb::arg("options") = "", nb::keep_alive<1, 2>(), nb::keep_alive<1, 5>())
      .def("describe", &Mono::describe);
}
