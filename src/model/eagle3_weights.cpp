// Loading an EAGLE3 draft checkpoint (model/eagle3_weights.h).
#include "model/eagle3_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/codecs.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace m3 {

namespace {

class DraftTensors {
 public:
  explicit DraftTensors(const std::filesystem::path& dir) : files_(SafetensorsSet::open(dir)) {}
  // The first of the spellings of `key` present: "midlayer.<key>", "layers.0.<key>", each also
  // under "model.", for layer tensors; "<key>" and "model.<key>" for the others.
  const TensorView* find(const std::string& key, bool layer) const {
    std::vector<std::string> names;
    if (layer)
      names = {"midlayer." + key, "layers.0." + key, "model.midlayer." + key, "model.layers.0." + key};
    else
      names = {key, "model." + key};
    for (const auto& n : names)
      if (const TensorView* t = files_.find(n)) return t;
    return nullptr;
  }
  Mat matrix(const std::string& key, bool layer, int rows, int cols, bool required = true) const {
    const TensorView* t = find(key, layer);
    M3_CHECK(t || !required, "EAGLE3 draft {}: tensor '{}{}' is missing", files_.source(), layer ? "midlayer." : "",
             key);
    if (!t) return {};
    const std::vector<int64_t> want = cols > 0 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    M3_CHECK(t->shape == want, "EAGLE3 draft {}: tensor '{}' has shape {}, expected {}", t->file, t->name,
             t->shape_str(), fmt::format("[{}]", fmt::join(want, ", ")));
    Mat m(rows, cols > 0 ? cols : 1);
    const size_t n = m.data.size();
    const uint8_t* p = t->data;
    switch (t->dtype) {
      case DType::F32:
        std::memcpy(m.data.data(), p, n * 4);
        break;
      case DType::BF16:
      case DType::F16:
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          m.data[i] = t->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        break;
      default:
        M3_FAIL("EAGLE3 draft {}: tensor '{}' is {}, expected BF16, F16 or F32", t->file, t->name,
                dtype_name(t->dtype));
    }
    for (size_t i = 0; i < n; ++i)
      M3_CHECK(std::isfinite(m.data[i]), "EAGLE3 draft {}: tensor '{}' element {} is {}", t->file, t->name, i,
               m.data[i]);
    return m;
  }
  Vec vector(const std::string& key, bool layer, int n) const { return matrix(key, layer, n, 0).data; }
  std::vector<int32_t> d2t(int draft_vocab, int vocab) const {
    const TensorView* t = find("d2t", false);
    if (!t) return {};
    M3_CHECK(t->shape == std::vector<int64_t>{draft_vocab}, "EAGLE3 draft {}: tensor 'd2t' has shape {}, expected [{}]",
             t->file, t->shape_str(), draft_vocab);
    M3_CHECK(t->dtype == DType::I64 || t->dtype == DType::I32,
             "EAGLE3 draft {}: tensor 'd2t' is {}, expected I64 (or I32)", t->file, dtype_name(t->dtype));
    std::vector<int32_t> out(static_cast<size_t>(draft_vocab));
    for (int i = 0; i < draft_vocab; ++i) {
      int64_t v;
      if (t->dtype == DType::I64) {
        std::memcpy(&v, t->data + 8 * size_t(i), 8);
      } else {
        int32_t w;
        std::memcpy(&w, t->data + 4 * size_t(i), 4);
        v = w;
      }
      M3_CHECK(i + v >= 0 && i + v < vocab, "EAGLE3 draft {}: d2t[{}] = {} maps draft id {} to {}, outside [0, {})",
               t->file, i, v, i, i + v, vocab);
      out[size_t(i)] = int32_t(v);
    }
    return out;
  }
  const SafetensorsSet& files() const { return files_; }

 private:
  SafetensorsSet files_;
};

Mat target_matrix(const WeightSource* target, WeightRole role, int rows, int cols, const char* what) {
  M3_CHECK(target, "EAGLE3 draft: the draft has no {} and no target checkpoint was given to share it", what);
  Mat m(rows, cols);
  target->read_rows(WeightKey{role}, 0, rows, 0, cols, m.data.data());
  return m;
}

}  // namespace

Eagle3Weights load_eagle3_weights(const std::filesystem::path& dir, const Eagle3Spec& s, const WeightSource* target) {
  const DraftTensors t(dir);
  const int H = s.hidden, I = s.intermediate;
  Eagle3Weights w;
  w.fc = t.matrix("fc.weight", false, H, s.fc_in());
  w.input_norm = t.vector("input_layernorm.weight", true, H);
  w.hidden_norm = t.vector("hidden_norm.weight", true, H);
  w.post_norm = t.vector("post_attention_layernorm.weight", true, H);
  w.norm = t.vector("norm.weight", false, H);
  w.wq = t.matrix("self_attn.q_proj.weight", true, s.q_dim(), 2 * H);
  w.wk = t.matrix("self_attn.k_proj.weight", true, s.kv_dim(), 2 * H);
  w.wv = t.matrix("self_attn.v_proj.weight", true, s.kv_dim(), 2 * H);
  w.wo = t.matrix("self_attn.o_proj.weight", true, H, s.q_dim());
  w.gate = t.matrix("mlp.gate_proj.weight", true, I, H);
  w.up = t.matrix("mlp.up_proj.weight", true, I, H);
  w.down = t.matrix("mlp.down_proj.weight", true, H, I);
  w.d2t = t.d2t(s.draft_vocab, s.vocab);
  w.embed = t.matrix("embed_tokens.weight", false, s.vocab, H, false);
  w.own_embed = !w.embed.empty();
  if (!w.own_embed) {
    M3_CHECK(s.hidden == s.target_hidden, "EAGLE3 draft {}: no embed_tokens, and its hidden size {} differs from the "
             "target's {} (the target's embedding cannot be shared)", t.files().source(), s.hidden, s.target_hidden);
    w.embed = target_matrix(target, WeightRole::Embed, s.vocab, H, "embed_tokens");
  }
  w.lm_head = t.matrix("lm_head.weight", false, s.draft_vocab, H, false);
  w.own_lm_head = !w.lm_head.empty();
  if (!w.own_lm_head) {
    M3_CHECK(s.draft_vocab == s.vocab && s.hidden == s.target_hidden,
             "EAGLE3 draft {}: no lm_head, and the target's cannot be shared (draft vocabulary {} of {}, hidden {} vs "
             "the target's {})", t.files().source(), s.draft_vocab, s.vocab, s.hidden, s.target_hidden);
    M3_CHECK(w.d2t.empty() || std::all_of(w.d2t.begin(), w.d2t.end(), [](int32_t v) { return v == 0; }),
             "EAGLE3 draft {}: a d2t mapping without the draft's own lm_head", t.files().source());
    w.lm_head = target_matrix(target, WeightRole::LmHead, s.vocab, H, "lm_head");
  }
  return w;
}

Eagle3Checkpoint load_eagle3_checkpoint(const std::filesystem::path& draft_dir, const std::filesystem::path& target_dir,
                                        const ModelSpec& target) {
  Eagle3Spec s = load_eagle3_spec(draft_dir, target);
  // the target's checkpoint, bound only for the tensors the draft shares
  const SafetensorsSet files = SafetensorsSet::open(target_dir);
  const WeightBinding binding = bind_weights(build_checkpoint_table(target, files, target_dir), files);
  const auto src = make_weight_source(binding);
  Eagle3Weights w = load_eagle3_weights(draft_dir, s, src.get());
  return {std::move(s), std::move(w)};
}

}  // namespace m3
