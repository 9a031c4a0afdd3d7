// The weight table of the MiniMax-M3 text model (names from m3-model.md, "Checkpoint tensor
// names"), its binding to a checkpoint (checked at both ends) and the dtype conversion to fp32.
#include "model/weight_table.h"

#include <fmt/format.h>

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
  add({"model.embed_tokens.weight"}, WeightRole::Embed, -1, -1, {V, H}, DType::BF16, Rows);
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

std::string scale_name_for(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() >= kSuffix.size() &&
      weight_name.compare(weight_name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    return weight_name + "_scale_inv";
  return weight_name + ".weight_scale_inv";
}

bool float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

}  // namespace

WeightBinding bind_weights(WeightTable table_in, const SafetensorsSet& files) {
  const char* src = files.source().c_str();
  WeightBinding b;
  b.table = std::move(table_in);
  const WeightTable& table = b.table;
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
    M3_CHECK(t.shape == e.shape, "{}: tensor '{}' has shape {}, expected {} for {}", t.file, t.name, t.shape_str(),
             shape_str(e.shape), e.describe());
    claimed.insert(t.name);
    if (t.dtype == DType::F8_E4M3 && e.matrix()) {
      // MXFP8: one E8M0 scale per 32 inputs of each row, stored as U8.
      std::string sn = scale_name_for(t.name);
      const TensorView* sc = files.find(sn);
      M3_CHECK(sc, "{}: tensor '{}' is F8_E4M3 but its scale '{}' is missing", t.file, t.name, sn);
      std::vector<int64_t> want{e.shape[0], (e.shape[1] + 31) / 32};
      M3_CHECK(sc->dtype == DType::U8, "{}: scale '{}' has dtype {}, expected U8 (E8M0)", sc->file, sn,
               dtype_name(sc->dtype));
      M3_CHECK(sc->shape == want, "{}: scale '{}' has shape {}, expected {}", sc->file, sn, sc->shape_str(),
               shape_str(want));
      w.scale = sc;
      claimed.insert(sn);
    } else {
      M3_CHECK(float_dtype(t.dtype), "{}: tensor '{}' has dtype {}, expected {} (accepted: BF16, F16, F32{}) for {}",
               t.file, t.name, dtype_name(t.dtype), dtype_name(e.dtype),
               e.matrix() ? ", or F8_E4M3 with weight_scale_inv" : "", e.describe());
    }
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
            "vision/projector/patch-merge/mtp): {}", src, unclaimed.size(), list);
  }
  return b;
}

void convert_to_f32(const BoundWeight& w, float* dst) {
  const TensorView& t = *w.tensor;
  const size_t n = size_t(t.numel());
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(dst, p, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case DType::F8_E4M3: {
      M3_CHECK(w.scale && t.shape.size() == 2, "{}: tensor '{}': F8_E4M3 without its scale", t.file, t.name);
      const size_t rows = size_t(t.shape[0]), cols = size_t(t.shape[1]), groups = (cols + 31) / 32;
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c)
          dst[r * cols + c] = e4m3_to_f32(p[r * cols + c]) * e8m0_to_f32(w.scale->data[r * groups + c / 32]);
      return;
    }
    default:
      M3_FAIL("{}: tensor '{}': cannot convert dtype {} to fp32", t.file, t.name, dtype_name(t.dtype));
  }
}

}  // namespace m3
