// The weight table of the MiniMax-M3 text model (names from m3-model.md, "Checkpoint tensor
// names"), its binding to a checkpoint (checked at both ends) and the dtype conversion to fp32.
#include "model/weight_table.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <set>

#include "core/check.h"
#include "core/codecs.h"

namespace m3 {

std::string_view weight_role_name(WeightRole r) {
  switch (r) {
    case WeightRole::Embed: return "embed";
    case WeightRole::LmHead: return "lm_head";
    case WeightRole::FinalNorm: return "final_norm";
    case WeightRole::InputNorm: return "input_norm";
    case WeightRole::PostNorm: return "post_norm";
    case WeightRole::Wq: return "wq";
    case WeightRole::Wk: return "wk";
    case WeightRole::Wv: return "wv";
    case WeightRole::Wo: return "wo";
    case WeightRole::QNorm: return "q_norm";
    case WeightRole::KNorm: return "k_norm";
    case WeightRole::IndexWq: return "index_wq";
    case WeightRole::IndexWk: return "index_wk";
    case WeightRole::IndexQNorm: return "index_q_norm";
    case WeightRole::IndexKNorm: return "index_k_norm";
    case WeightRole::DenseGate: return "dense_gate";
    case WeightRole::DenseUp: return "dense_up";
    case WeightRole::DenseDown: return "dense_down";
    case WeightRole::Router: return "router";
    case WeightRole::RouterBias: return "router_bias";
    case WeightRole::ExpertGate: return "expert_gate";
    case WeightRole::ExpertUp: return "expert_up";
    case WeightRole::ExpertDown: return "expert_down";
    case WeightRole::SharedGate: return "shared_gate";
    case WeightRole::SharedUp: return "shared_up";
    case WeightRole::SharedDown: return "shared_down";
  }
  M3_FAIL("invalid weight role {}", int(r));
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

std::string WeightEntry::describe() const {
  std::string where = layer >= 0 ? fmt::format("layer {} ", layer) : "";
  if (expert >= 0) where += fmt::format("expert {} ", expert);
  return fmt::format("{}{} {} {}", where, weight_role_name(role), shape_str(shape), dtype_name(dtype));
}

WeightTable build_weight_table(const ModelSpec& s, const std::string& prefix) {
  s.validate();
  WeightTable t;
  t.prefix = prefix;
  const int64_t H = s.hidden, V = s.vocab_size;
  auto add = [&](std::vector<std::string> names, WeightRole role, int layer, int expert, std::vector<int64_t> shape,
                 DType dt, ShardDim shard) {
    for (auto& n : names) n = prefix + n;
    t.entries.push_back(WeightEntry{std::move(names), role, layer, expert, std::move(shape), dt, shard});
  };
  const auto R = ShardDim::Replicated, Rows = ShardDim::Rows, Cols = ShardDim::Cols;
  // the embedding is replicated (every rank looks its tokens up); lm_head is vocabulary-parallel
  add({"model.embed_tokens.weight"}, WeightRole::Embed, -1, -1, {V, H}, DType::BF16, R);
  add({"lm_head.weight"}, WeightRole::LmHead, -1, -1, {V, H}, DType::BF16, Rows);
  add({"model.norm.weight"}, WeightRole::FinalNorm, -1, -1, {H}, DType::BF16, R);
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string L = fmt::format("model.layers.{}.", l);
    const std::string A = L + "self_attn.";
    add({L + "input_layernorm.weight"}, WeightRole::InputNorm, l, -1, {H}, DType::BF16, R);
    add({L + "post_attention_layernorm.weight"}, WeightRole::PostNorm, l, -1, {H}, DType::BF16, R);
    add({A + "q_proj.weight"}, WeightRole::Wq, l, -1, {s.q_dim(), H}, DType::BF16, Rows);
    add({A + "k_proj.weight"}, WeightRole::Wk, l, -1, {s.kv_dim(), H}, DType::BF16, Rows);
    add({A + "v_proj.weight"}, WeightRole::Wv, l, -1, {s.kv_dim(), H}, DType::BF16, Rows);
    add({A + "o_proj.weight"}, WeightRole::Wo, l, -1, {H, s.q_dim()}, DType::BF16, Cols);
    add({A + "q_norm.weight"}, WeightRole::QNorm, l, -1, {s.head_dim}, DType::BF16, R);
    add({A + "k_norm.weight"}, WeightRole::KNorm, l, -1, {s.head_dim}, DType::BF16, R);
    if (s.sparse(l)) {
      add({A + "index_q_proj.weight"}, WeightRole::IndexWq, l, -1, {int64_t(s.index_heads) * s.index_dim, H},
          DType::BF16, Rows);
      // one index-K vector shared by all groups: every rank needs all of it
      add({A + "index_k_proj.weight"}, WeightRole::IndexWk, l, -1, {s.index_dim, H}, DType::BF16, R);
      add({A + "index_q_norm.weight"}, WeightRole::IndexQNorm, l, -1, {s.index_dim}, DType::BF16, R);
      add({A + "index_k_norm.weight"}, WeightRole::IndexKNorm, l, -1, {s.index_dim}, DType::BF16, R);
    }
    const std::string M = L + "block_sparse_moe.";
    if (!s.moe(l)) {
      // released: mlp.*; transformers 5.17 writes the same tensors under block_sparse_moe.*
      const int64_t I = s.dense_inter;
      add({L + "mlp.gate_proj.weight", M + "gate_proj.weight"}, WeightRole::DenseGate, l, -1, {I, H}, DType::BF16, Rows);
      add({L + "mlp.up_proj.weight", M + "up_proj.weight"}, WeightRole::DenseUp, l, -1, {I, H}, DType::BF16, Rows);
      add({L + "mlp.down_proj.weight", M + "down_proj.weight"}, WeightRole::DenseDown, l, -1, {H, I}, DType::BF16,
          Cols);
      continue;
    }
    const int64_t E = s.num_experts, I = s.moe_inter;
    add({M + "gate.weight"}, WeightRole::Router, l, -1, {E, H}, DType::F32, R);
    add({M + "e_score_correction_bias"}, WeightRole::RouterBias, l, -1, {E}, DType::F32, R);
    for (int e = 0; e < s.num_experts; ++e) {
      const std::string X = fmt::format("{}experts.{}.", M, e);
      add({X + "w1.weight"}, WeightRole::ExpertGate, l, e, {I, H}, DType::BF16, Rows);
      add({X + "w3.weight"}, WeightRole::ExpertUp, l, e, {I, H}, DType::BF16, Rows);
      add({X + "w2.weight"}, WeightRole::ExpertDown, l, e, {H, I}, DType::BF16, Cols);
    }
    if (s.shared_inter > 0) {
      const int64_t S = s.shared_inter;
      add({M + "shared_experts.gate_proj.weight"}, WeightRole::SharedGate, l, -1, {S, H}, DType::BF16, Rows);
      add({M + "shared_experts.up_proj.weight"}, WeightRole::SharedUp, l, -1, {S, H}, DType::BF16, Rows);
      add({M + "shared_experts.down_proj.weight"}, WeightRole::SharedDown, l, -1, {H, S}, DType::BF16, Cols);
    }
  }
  return t;
}

WeightTable build_checkpoint_table(const ModelSpec& spec, const SafetensorsSet& files,
                                   const std::filesystem::path& model_dir) {
  WeightTable t = build_weight_table(spec, detect_text_prefix(files));
  t.quant = load_quant_config(model_dir);
  return t;
}

std::string detect_text_prefix(const SafetensorsSet& files) {
  if (files.find("language_model.model.embed_tokens.weight")) return "language_model.";
  if (files.find("model.embed_tokens.weight")) return "";
  return "language_model.";  // the released layout; binding will name what is missing
}

bool is_ignored_tensor(std::string_view name) {
  for (std::string_view p : {"vision_tower.", "multi_modal_projector.", "patch_merge_mlp."})
    if (name.substr(0, p.size()) == p) return true;
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    std::string_view part = name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part == "mtp" || part.substr(0, 4) == "mtp_") return true;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return false;
}

namespace {

// "<module>.<suffix>" for a tensor named "<module>.weight" (else "<name>.<suffix>").
std::string module_of(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() >= kSuffix.size() &&
      weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    return weight_name.substr(0, weight_name.size() - kSuffix.size());
  return weight_name;
}

bool float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

// Linear layers: every matrix but the embedding table (an nn.Embedding, never quantized).
bool linear_role(const WeightEntry& e) { return e.matrix() && e.role != WeightRole::Embed; }

// The companion named "<module>.<one of suffixes>" (none, or an error when two are present).
const TensorView* find_companion(const SafetensorsSet& files, const TensorView& t, const std::string& module,
                                 std::initializer_list<const char*> suffixes, std::string* found) {
  const TensorView* hit = nullptr;
  for (const char* sfx : suffixes) {
    const std::string n = module + "." + sfx;
    if (const TensorView* v = files.find(n)) {
      M3_CHECK(!hit, "{}: tensor '{}' has two scales, '{}' and '{}'", t.file, t.name, *found, n);
      hit = v;
      *found = n;
    }
  }
  return hit;
}

std::string suffix_list(std::initializer_list<const char*> suffixes, const std::string& module) {
  std::string out;
  for (const char* sfx : suffixes) out += fmt::format("{}'{}.{}'", out.empty() ? "" : " or ", module, sfx);
  return out;
}

// The E8M0 scale companion [rows, ceil(cols / 32)] of an MX tensor.
const TensorView* bind_mx_scale(const SafetensorsSet& files, const TensorView& t, const WeightEntry& e,
                                const std::string& module, std::initializer_list<const char*> suffixes,
                                std::set<std::string>& claimed) {
  std::string sn;
  const TensorView* sc = find_companion(files, t, module, suffixes, &sn);
  M3_CHECK(sc, "{}: tensor '{}' is {} but its scale {} is missing ({})", t.file, t.name, dtype_name(t.dtype),
           suffix_list(suffixes, module), e.describe());
  const std::vector<int64_t> want{e.shape[0], (e.shape[1] + 31) / 32};
  M3_CHECK(sc->dtype == DType::U8, "{}: scale '{}' has dtype {}, expected U8 (E8M0)", sc->file, sn,
           dtype_name(sc->dtype));
  M3_CHECK(sc->shape == want, "{}: scale '{}' has shape {}, expected {} (one E8M0 per 32 inputs of {})", sc->file, sn,
           sc->shape_str(), shape_str(want), e.describe());
  claimed.insert(sn);
  return sc;
}

// One-element F32 tensor (shape [] or [1]).
bool scalar_f32(const TensorView& v) { return v.dtype == DType::F32 && v.numel() == 1 && v.shape.size() <= 1; }

}  // namespace

WeightBinding bind_weights(WeightTable table_in, const SafetensorsSet& files) {
  const char* src = files.source().c_str();
  WeightBinding b;
  b.table = std::move(table_in);
  const WeightTable& table = b.table;
  const QuantConfig& qc = table.quant;
  b.weights.reserve(table.entries.size());
  std::set<std::string> claimed;
  size_t missing = 0;
  std::string first_missing;
  for (const auto& e : table.entries) {
    BoundWeight w;
    w.entry = &e;
    std::string found;
    for (const auto& n : e.names) {
      const TensorView* v = files.find(n);
      if (!v) continue;
      M3_CHECK(!w.tensor, "{}: tensors '{}' and '{}' are both present; they are two spellings of the same weight ({})",
               src, found, n, e.describe());
      w.tensor = v;
      found = n;
    }
    if (!w.tensor) {
      if (missing++ == 0) {
        first_missing = fmt::format("'{}'", e.names[0]);
        for (size_t i = 1; i < e.names.size(); ++i) first_missing += fmt::format(" (or '{}')", e.names[i]);
        first_missing += fmt::format(", expected {}", e.describe());
      }
      continue;
    }
    const TensorView& t = *w.tensor;
    claimed.insert(t.name);
    const std::string module = module_of(t.name);
    std::string why;
    WeightQuant want = WeightQuant::Float;
    if (linear_role(e)) {
      want = qc.expected(module, &why);
      // no quantization_config: MXFP8 where the files hold F8_E4M3 (the layout read before configs)
      if (qc.method == QuantMethod::None && t.dtype == DType::F8_E4M3) want = WeightQuant::Mxfp8;
    }
    auto declared = [&] {
      return qc.method == QuantMethod::None ? std::string("no quantization_config in config.json")
                                            : fmt::format("{} declares it {} ({})", qc.origin, weight_quant_name(want),
                                                          why);
    };
    switch (want) {
      case WeightQuant::Float:
        M3_CHECK(float_dtype(t.dtype), "{}: tensor '{}' has dtype {}, expected {} (accepted: BF16, F16, F32) for {}; {}",
                 t.file, t.name, dtype_name(t.dtype), dtype_name(e.dtype), e.describe(),
                 linear_role(e) ? declared() : std::string("this tensor is never quantized"));
        M3_CHECK(t.shape == e.shape, "{}: tensor '{}' has shape {}, expected {} for {}", t.file, t.name, t.shape_str(),
                 shape_str(e.shape), e.describe());
        break;
      case WeightQuant::Mxfp8:
      case WeightQuant::Fp8Tensor:
        M3_CHECK(t.dtype == DType::F8_E4M3, "{}: tensor '{}' has dtype {}, expected F8_E4M3 for {}: {}", t.file,
                 t.name, dtype_name(t.dtype), e.describe(), declared());
        M3_CHECK(t.shape == e.shape, "{}: tensor '{}' has shape {}, expected {} for {}", t.file, t.name, t.shape_str(),
                 shape_str(e.shape), e.describe());
        if (want == WeightQuant::Mxfp8) {
          w.scale = bind_mx_scale(files, t, e, module, {"weight_scale_inv", "weight_scale"}, claimed);
        } else {
          std::string sn;
          w.scale = find_companion(files, t, module, {"weight_scale"}, &sn);
          M3_CHECK(w.scale, "{}: tensor '{}' is F8_E4M3 per-tensor but its scale '{}.weight_scale' is missing ({})",
                   t.file, t.name, module, declared());
          M3_CHECK(scalar_f32(*w.scale), "{}: scale '{}' has dtype {} and shape {}, expected one F32", w.scale->file,
                   sn, dtype_name(w.scale->dtype), w.scale->shape_str());
          float sv;
          std::memcpy(&sv, w.scale->data, 4);
          M3_CHECK(std::isfinite(sv) && sv > 0, "{}: scale '{}' is {}, not a finite positive number", w.scale->file,
                   sn, sv);
          claimed.insert(sn);
          if (const TensorView* is = files.find(module + ".input_scale")) {
            M3_CHECK(scalar_f32(*is), "{}: '{}' has dtype {} and shape {}, expected one F32", is->file, is->name,
                     dtype_name(is->dtype), is->shape_str());
            claimed.insert(is->name);
          }
        }
        break;
      case WeightQuant::Mxfp4: {
        const std::vector<int64_t> packed{e.shape[0], (e.shape[1] + 1) / 2};
        M3_CHECK(t.dtype == DType::U8, "{}: tensor '{}' has dtype {}, expected U8 (packed E2M1 pairs) for {}: {}",
                 t.file, t.name, dtype_name(t.dtype), e.describe(), declared());
        M3_CHECK(t.shape == packed, "{}: tensor '{}' has shape {}, expected {} (two E2M1 codes per byte) for {}",
                 t.file, t.name, t.shape_str(), shape_str(packed), e.describe());
        w.scale = bind_mx_scale(files, t, e, module, {"weight_scale", "scale"}, claimed);
        break;
      }
    }
    w.quant = want;
    b.weights.push_back(w);
  }
  M3_CHECK(missing == 0, "{}: {} tensor(s) of the text model are missing; the first is {}", src, missing,
           first_missing);

  std::vector<std::string> unclaimed;
  for (const auto& n : files.names()) {
    if (claimed.count(n)) continue;
    if (is_ignored_tensor(n)) b.ignored.push_back(n);
    else unclaimed.push_back(n);
  }
  if (!unclaimed.empty()) {
    std::string list;
    for (size_t i = 0; i < unclaimed.size() && i < 5; ++i) list += (i ? ", '" : "'") + unclaimed[i] + "'";
    if (unclaimed.size() > 5) list += fmt::format(" and {} more", unclaimed.size() - 5);
    M3_FAIL("{}: {} tensor(s) are not claimed by the weight table of this config (not text-model tensors, nor "
            "vision/projector/patch-merge/mtp, nor the scales of quantized ones; quantization_config: {}): {}",
            src, unclaimed.size(), qc.describe(), list);
  }
  return b;
}

namespace {

// One E4M3 code of a quantized tensor; the NaN codes (0x7f, 0xff) are an error naming it.
float e4m3_checked(const BoundWeight& w, int64_t r, int64_t c, uint8_t code) {
  M3_CHECK((code & 0x7f) != 0x7f, "{}: tensor '{}' holds the E4M3 NaN code 0x{:02x} at row {}, column {}",
           w.tensor->file, w.tensor->name, code, r, c);
  return e4m3_to_f32(code);
}

// The E8M0 scale byte of row r, block c / 32; 255 (NaN) is an error naming the tensor and block.
float mx_scale(const BoundWeight& w, int64_t r, int64_t c) {
  const TensorView& s = *w.scale;
  const int64_t blocks = s.shape[1];
  const uint8_t b = s.data[r * blocks + c / 32];
  M3_CHECK(b != 0xff, "{}: scale '{}' is E8M0 255 (NaN) at row {}, block {} (columns {}..{}) of '{}'", s.file, s.name,
           r, c / 32, c / 32 * 32, c / 32 * 32 + 31, w.tensor->name);
  return e8m0_to_f32(b);
}

}  // namespace

void read_rows_f32(const BoundWeight& w, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, float* out) {
  const TensorView& t = *w.tensor;
  const WeightEntry& e = *w.entry;
  const int64_t rows = e.matrix() ? e.shape[0] : 1;
  const int64_t cols = e.matrix() ? e.shape[1] : (e.shape.empty() ? 1 : e.shape[0]);
  M3_CHECK(row0 >= 0 && nrows >= 0 && row0 + nrows <= rows && col0 >= 0 && ncols >= 0 && col0 + ncols <= cols,
           "{}: tensor '{}': rows [{}, {}) cols [{}, {}) outside [{}, {}]", t.file, t.name, row0, row0 + nrows, col0,
           col0 + ncols, rows, cols);
  const uint8_t* p = t.data;
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t row = row0 + r;
    float* o = out + r * ncols;
    switch (w.quant) {
      case WeightQuant::Float: {
        const int64_t base = row * cols + col0;
        switch (t.dtype) {
          case DType::F32: std::memcpy(o, p + base * 4, size_t(ncols) * 4); break;
          case DType::BF16:
            for (int64_t c = 0; c < ncols; ++c) {
              uint16_t h;
              std::memcpy(&h, p + 2 * (base + c), 2);
              o[c] = bf16_to_f32(h);
            }
            break;
          case DType::F16:
            for (int64_t c = 0; c < ncols; ++c) {
              uint16_t h;
              std::memcpy(&h, p + 2 * (base + c), 2);
              o[c] = f16_to_f32(h);
            }
            break;
          default: M3_FAIL("{}: tensor '{}': cannot read dtype {}", t.file, t.name, dtype_name(t.dtype));
        }
        break;
      }
      case WeightQuant::Mxfp8:
        for (int64_t c = col0; c < col0 + ncols; ++c)
          o[c - col0] = e4m3_checked(w, row, c, p[row * cols + c]) * mx_scale(w, row, c);
        break;
      case WeightQuant::Fp8Tensor: {
        float s;
        std::memcpy(&s, w.scale->data, 4);  // finite and positive: bind_weights checked it
        for (int64_t c = col0; c < col0 + ncols; ++c) o[c - col0] = e4m3_checked(w, row, c, p[row * cols + c]) * s;
        break;
      }
      case WeightQuant::Mxfp4: {
        const int64_t ld = (cols + 1) / 2;
        for (int64_t c = col0; c < col0 + ncols; ++c) {
          const uint8_t byte = p[row * ld + c / 2];
          o[c - col0] = e2m1_to_f32((c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf)) * mx_scale(w, row, c);
        }
        break;
      }
    }
  }
}

void convert_to_f32(const BoundWeight& w, float* dst) {
  const WeightEntry& e = *w.entry;
  const int64_t rows = e.matrix() ? e.shape[0] : 1;
  const int64_t cols = e.matrix() ? e.shape[1] : (e.shape.empty() ? 1 : e.shape[0]);
  read_rows_f32(w, 0, rows, 0, cols, dst);
}

}  // namespace m3
