// The EAGLE3 draft on the CPU (ref/eagle3.h).
#include "ref/eagle3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "core/check.h"
#include "core/codecs.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/weight_table.h"
#include "ref/attention.h"
#include "ref/linear.h"

namespace m3::ref {

namespace {

// Llama's RMS norm in double: y = x / sqrt(mean(x^2) + eps) * w.
void llama_rms_norm(const float* x, const float* w, int n, float eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const double inv = 1.0 / std::sqrt(ss / n + double(eps));
  for (int i = 0; i < n; ++i) y[i] = float(double(x[i]) * inv * double(w[i]));
}

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

Eagle3Model::Eagle3Model(Eagle3Spec spec, Eagle3Weights w, int threads)
    : s_(std::move(spec)), w_(std::move(w)), pool_(threads) {
  const int half = s_.head_dim / 2;
  inv_freq_.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(s_.rope_theta, double(2 * i) / double(s_.head_dim));
    if (s_.rope_factor > 0) {  // llama3: long wavelengths slowed by factor, a smooth ramp between
      const double lo_wave = s_.rope_original_max / s_.rope_low_freq, hi_wave = s_.rope_original_max / s_.rope_high_freq;
      const double wave = 2 * std::numbers::pi / f;
      if (wave > lo_wave) {
        f /= s_.rope_factor;
      } else if (wave >= hi_wave) {
        const double smooth = (s_.rope_original_max / wave - s_.rope_low_freq) / (s_.rope_high_freq - s_.rope_low_freq);
        f = (1 - smooth) * f / s_.rope_factor + smooth * f;
      }
    }
    inv_freq_[size_t(i)] = f;
  }
}

std::vector<float> Eagle3Model::forward(Eagle3Cache& cache, int32_t start, std::span<const int32_t> tokens,
                                        const float* hidden, Input in, std::vector<float>* last_logits) {
  const int n = int(tokens.size()), H = s_.hidden, hd = s_.head_dim, nh = s_.num_heads, kvh = s_.num_kv_heads;
  const int qd = s_.q_dim(), kd = s_.kv_dim(), I = s_.intermediate;
  M3_CHECK(n >= 1, "EAGLE3 draft: no rows");
  M3_CHECK(start >= 0 && start <= cache.len,
           "EAGLE3 draft: {} rows from position {}, but the draft cache holds positions [0, {}) only", n, start,
           cache.len);
  for (size_t i = 0; i < tokens.size(); ++i)
    M3_CHECK(tokens[i] >= 0 && tokens[i] < s_.vocab, "EAGLE3 draft: row {} (position {}) has token {} outside the "
             "vocabulary [0, {})", i, start + int(i), tokens[i], s_.vocab);
  std::vector<float> h(size_t(n) * H);
  if (in == Input::DraftPrenorm) std::copy_n(hidden, h.size(), h.data());
  else linear(w_.fc, hidden, s_.fc_in(), n, h.data(), H, pool_);
  std::vector<float> a(size_t(n) * 2 * H), r(size_t(n) * H);
  for (int i = 0; i < n; ++i) {
    float* ai = a.data() + size_t(i) * 2 * H;
    float* hi = h.data() + size_t(i) * H;
    llama_rms_norm(w_.embed.row(tokens[size_t(i)]), w_.input_norm.data(), H, s_.rms_eps, ai);
    llama_rms_norm(hi, w_.hidden_norm.data(), H, s_.rms_eps, ai + H);
    std::copy_n(s_.norm_before_residual ? ai + H : hi, H, r.data() + size_t(i) * H);
  }
  std::vector<float> q(size_t(n) * qd), k(size_t(n) * kd), v(size_t(n) * kd);
  linear(w_.wq, a.data(), 2 * H, n, q.data(), qd, pool_);
  linear(w_.wk, a.data(), 2 * H, n, k.data(), kd, pool_);
  linear(w_.wv, a.data(), 2 * H, n, v.data(), kd, pool_);
  auto rope = [&](float* x, int heads, int pos) {
    for (int hh = 0; hh < heads; ++hh) {
      float* y = x + size_t(hh) * hd;
      for (int j = 0; j < hd / 2; ++j) {
        const double ang = double(pos) * inv_freq_[size_t(j)], c = std::cos(ang), sn = std::sin(ang);
        const double x1 = y[j], x2 = y[j + hd / 2];
        y[j] = float(x1 * c - x2 * sn);
        y[j + hd / 2] = float(x2 * c + x1 * sn);
      }
    }
  };
  const int end = start + n;
  if (int64_t(cache.k.size()) < int64_t(end) * kd) {
    const size_t cap = std::max(size_t(end) * kd, cache.k.size() * 2);
    cache.k.resize(cap);
    cache.v.resize(cap);
  }
  for (int i = 0; i < n; ++i) {
    rope(q.data() + size_t(i) * qd, nh, start + i);
    rope(k.data() + size_t(i) * kd, kvh, start + i);
    std::copy_n(k.data() + size_t(i) * kd, kd, cache.k.data() + size_t(start + i) * kd);
    std::copy_n(v.data() + size_t(i) * kd, kd, cache.v.data() + size_t(start + i) * kd);
  }
  std::vector<int64_t> slots(static_cast<size_t>(end));
  for (int j = 0; j < end; ++j) slots[size_t(j)] = j;
  std::vector<float> o(size_t(n) * qd);
  const double scale = 1.0 / std::sqrt(double(hd));
  const int gs = nh / kvh;
  pool_.parallel_for(int64_t(n) * nh, [&](int64_t b, int64_t e) {
    for (int64_t x = b; x < e; ++x) {
      const int i = int(x / nh), hh = int(x % nh), g = hh / gs;
      attend_head(q.data() + size_t(i) * qd + size_t(hh) * hd, cache.k.data() + size_t(g) * hd,
                  cache.v.data() + size_t(g) * hd, kd, slots.data(), start + i + 1, hd, scale,
                  o.data() + size_t(i) * qd + size_t(hh) * hd);
    }
  });
  std::vector<float> y(size_t(n) * H);
  linear(w_.wo, o.data(), qd, n, y.data(), H, pool_);
  for (size_t i = 0; i < y.size(); ++i) r[i] += y[i];
  std::vector<float> z(size_t(n) * H), g1(size_t(n) * I), u(size_t(n) * I);
  for (int i = 0; i < n; ++i)
    llama_rms_norm(r.data() + size_t(i) * H, w_.post_norm.data(), H, s_.rms_eps, z.data() + size_t(i) * H);
  linear(w_.gate, z.data(), H, n, g1.data(), I, pool_);
  linear(w_.up, z.data(), H, n, u.data(), I, pool_);
  for (size_t i = 0; i < g1.size(); ++i) {
    const double gv = g1[i];
    g1[i] = float(gv / (1.0 + std::exp(-gv)) * double(u[i]));
  }
  linear(w_.down, g1.data(), I, n, y.data(), H, pool_);
  for (size_t i = 0; i < y.size(); ++i) r[i] += y[i];
  if (last_logits) {
    std::vector<float> xn(static_cast<size_t>(H)), dl(static_cast<size_t>(w_.lm_head.rows));
    llama_rms_norm(r.data() + size_t(n - 1) * H, w_.norm.data(), H, s_.rms_eps, xn.data());
    linear(w_.lm_head, xn.data(), H, 1, dl.data(), w_.lm_head.rows, pool_);
    if (w_.d2t.empty() && w_.lm_head.rows == s_.vocab) {
      *last_logits = std::move(dl);
    } else {
      last_logits->assign(size_t(s_.vocab), -std::numeric_limits<float>::infinity());
      for (int i = 0; i < w_.lm_head.rows; ++i)
        (*last_logits)[size_t(i + (w_.d2t.empty() ? 0 : w_.d2t[size_t(i)]))] = dl[size_t(i)];
    }
  }
  return r;
}

namespace {
int32_t argmax(const std::vector<float>& x) {
  return int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // the first of equal maxima
}
}  // namespace

void Eagle3Drafter::observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) {
  if (next.empty()) return;
  Seq& s = seqs_[seq];
  M3_CHECK(start <= s.cache.len,
           "EAGLE3 drafter: sequence {} observed from position {} but it has seen positions [0, {}) only", seq, start,
           s.cache.len);
  std::vector<float> logits;
  const std::vector<float> r = m_->forward(s.cache, start, next, aux, Eagle3Model::Input::TargetAux, &logits);
  s.cache.len = start + int32_t(next.size());
  const int H = m_->spec().hidden;
  s.prenorm.assign(r.end() - H, r.end());
  s.first = argmax(logits);
}

std::vector<int32_t> Eagle3Drafter::propose(uint64_t seq, int k) {
  auto it = seqs_.find(seq);
  if (k <= 0 || it == seqs_.end() || it->second.first < 0) return {};
  Seq& s = it->second;
  std::vector<int32_t> drafts{s.first};
  std::vector<float> h = s.prenorm, logits;
  // Draft i + 1 from the row at position len + i - 1 (its token: draft i); these positions' K/V are
  // overwritten when the target's kept tokens there are observed.
  Eagle3Cache& c = s.cache;
  const int32_t len = c.len;
  for (int i = 1; i < k; ++i) {
    const int32_t tok = drafts.back();
    const int saved = c.len;
    c.len = len + i - 1;  // the row's position: after the observed ones and the drafts before it
    h = m_->forward(c, len + i - 1, std::span<const int32_t>(&tok, 1), h.data(), Eagle3Model::Input::DraftPrenorm,
                    &logits);
    c.len = saved;
    drafts.push_back(argmax(logits));
  }
  return drafts;
}

std::shared_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& draft_dir,
                                                   const std::filesystem::path& target_dir, const ModelSpec& target,
                                                   int threads) {
  Eagle3Spec s = load_eagle3_spec(draft_dir, target);
  // the target's checkpoint, bound only for the tensors the draft shares
  const SafetensorsSet files = SafetensorsSet::open(target_dir);
  const WeightBinding binding = bind_weights(build_checkpoint_table(target, files, target_dir), files);
  const auto src = make_weight_source(binding);
  Eagle3Weights w = load_eagle3_weights(draft_dir, s, src.get());
  return std::make_shared<Eagle3Drafter>(std::make_shared<Eagle3Model>(std::move(s), std::move(w), threads));
}

}  // namespace m3::ref
