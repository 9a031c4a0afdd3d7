// The EAGLE3 draft on the CPU (ref/eagle3.h).
#include "ref/eagle3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/check.h"
#include "core/codecs.h"
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

}  // namespace

Eagle3Model::Eagle3Model(Eagle3Spec spec, Eagle3Weights w, int threads)
    : s_(std::move(spec)), w_(std::move(w)), pool_(threads) {
  inv_freq_ = eagle3_inv_freq(s_);
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

struct CpuSeq final : Eagle3SeqState {
  Eagle3Cache cache;
  std::vector<float> observed, drafted;  // pre-norm rows: the last observed one, the last draft's
};
}  // namespace

std::unique_ptr<Eagle3SeqState> Eagle3Model::new_sequence() { return std::make_unique<CpuSeq>(); }

int32_t Eagle3Model::observe(Eagle3SeqState& st, int32_t start, std::span<const int32_t> tokens, const float* aux) {
  auto& s = static_cast<CpuSeq&>(st);
  std::vector<float> logits;
  const std::vector<float> r = forward(s.cache, start, tokens, aux, Input::TargetAux, &logits);
  s.cache.len = start + int32_t(tokens.size());
  s.observed.assign(r.end() - s_.hidden, r.end());
  return argmax(logits);
}

int32_t Eagle3Model::draft(Eagle3SeqState& st, int32_t pos, int32_t token, bool from_observed) {
  auto& s = static_cast<CpuSeq&>(st);
  const std::vector<float> h = from_observed ? s.observed : s.drafted;
  M3_CHECK(int(h.size()) == s_.hidden, "EAGLE3 draft: a draft row at position {} before any {} row", pos,
           from_observed ? "observed" : "draft");
  std::vector<float> logits;
  const int saved = s.cache.len;
  s.cache.len = pos;  // the row's position: after the observed ones and the drafts before it
  try {
    s.drafted = forward(s.cache, pos, std::span<const int32_t>(&token, 1), h.data(), Input::DraftPrenorm, &logits);
  } catch (...) {
    s.cache.len = saved;
    throw;
  }
  s.cache.len = saved;
  return argmax(logits);
}

std::shared_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& draft_dir,
                                                   const std::filesystem::path& target_dir, const ModelSpec& target,
                                                   int threads) {
  Eagle3Checkpoint c = load_eagle3_checkpoint(draft_dir, target_dir, target);
  return std::make_shared<Eagle3Drafter>(
      std::make_shared<Eagle3Model>(std::move(c.spec), std::move(c.weights), threads));
}

}  // namespace m3::ref
