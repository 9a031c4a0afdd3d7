// attention_block / ffn_block / forward_step. Parallel loops are over tokens, (token, group) or
// (token, head); each output element is produced by one iteration with a fixed order, so results
// do not depend on the thread count, the batch composition or how a prompt is chunked.
#include "ref/forward.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ref/attention.h"
#include "ref/indexer.h"
#include "ref/linear.h"
#include "ref/mlp.h"
#include "ref/moe.h"
#include "ref/norm.h"

namespace m3::ref {

namespace {
void norm_rows(ThreadPool& pool, const float* x, const Vec& w, int n_rows, int width, float eps, float* y) {
  pool.parallel_for(n_rows, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) gemma_rms_norm(x + t * width, w.data(), width, eps, y + t * width);
  });
}
}  // namespace

void attention_block(const ForwardContext& c, int l, const StepPlan& p, float* x,
                     std::vector<std::vector<std::vector<int32_t>>>* sel) {
  const ModelSpec& s = c.spec;
  const LayerWeights& L = c.w.layers[size_t(l)];
  const int T = p.num_tokens, H = s.hidden, hd = s.head_dim, nh = s.num_heads, kvh = s.num_kv_heads;
  const int qd = s.q_dim(), kvd = s.kv_dim(), gs = s.group_size();
  const int64_t cs = c.cache.kv_stride();
  float* kc = c.cache.k(l);
  float* vc = c.cache.v(l);

  std::vector<float> a(size_t(T) * H);
  norm_rows(c.pool, x, L.input_norm, T, H, s.rms_eps, a.data());
  std::vector<float> q(size_t(T) * qd), k(size_t(T) * kvd), v(size_t(T) * kvd);
  linear(L.wq, a.data(), H, T, q.data(), qd, c.pool);
  linear(L.wk, a.data(), H, T, k.data(), kvd, c.pool);
  linear(L.wv, a.data(), H, T, v.data(), kvd, c.pool);
  // per-head norms, RoPE after the norm; K (normed, rotated) and V (raw) into the cache
  c.pool.parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int32_t pos = p.pos[size_t(t)];
      for (int h = 0; h < nh; ++h) {
        float* qh = q.data() + t * qd + h * hd;
        gemma_rms_norm(qh, L.q_norm.data(), hd, s.rms_eps, qh);
        c.rope.apply(qh, pos);
      }
      for (int g = 0; g < kvh; ++g) {
        float* kh = k.data() + t * kvd + g * hd;
        gemma_rms_norm(kh, L.k_norm.data(), hd, s.rms_eps, kh);
        c.rope.apply(kh, pos);
      }
      const int64_t slot = p.slot[size_t(t)];
      std::copy_n(k.data() + t * kvd, kvd, kc + slot * cs);
      std::copy_n(v.data() + t * kvd, kvd, vc + slot * cs);
    }
  });

  // MSA: per (token, group) the key slots to attend over
  std::vector<std::vector<int64_t>> keys;
  if (s.sparse(l)) {
    const int id = s.index_dim, ih = s.index_heads, bs = c.cache.block_size();
    const int64_t is = c.cache.ik_stride();
    float* ikc = c.cache.ik(l);
    std::vector<float> iq(size_t(T) * ih * id), ik(size_t(T) * id);
    linear(L.wiq, a.data(), H, T, iq.data(), int64_t(ih) * id, c.pool);
    linear(L.wik, a.data(), H, T, ik.data(), id, c.pool);
    c.pool.parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t pos = p.pos[size_t(t)];
        for (int g = 0; g < ih; ++g) {
          float* qg = iq.data() + (t * ih + g) * id;
          gemma_rms_norm(qg, L.iq_norm.data(), id, s.rms_eps, qg);
          c.rope.apply(qg, pos);
        }
        float* kt = ik.data() + t * id;
        gemma_rms_norm(kt, L.ik_norm.data(), id, s.rms_eps, kt);
        c.rope.apply(kt, pos);
        std::copy_n(kt, id, ikc + p.slot[size_t(t)] * is);
      }
    });
    keys.resize(size_t(T) * kvh);
    if (sel) sel->assign(size_t(T), std::vector<std::vector<int32_t>>(size_t(kvh)));
    c.pool.parallel_for(int64_t(T) * kvh, [&](int64_t b, int64_t e) {
      std::vector<float> scores;
      for (int64_t i = b; i < e; ++i) {
        const int64_t t = i / kvh;
        const int g = int(i % kvh);
        const int32_t pos = p.pos[size_t(t)];
        const int n = pos + 1;
        const auto& ss = p.seq_slots[size_t(p.seq[size_t(t)])];
        scores.resize(size_t(n));
        index_scores(iq.data() + (t * ih + g) * id, ikc, is, ss.data(), n, id, scores.data());
        std::vector<float> bsc = block_max_pool(scores.data(), n, bs);
        std::vector<int32_t> blocks = select_blocks(bsc.data(), int(bsc.size()), pos / bs, s.index_topk, s.index_local);
        auto& kl = keys[size_t(i)];
        for (int32_t blk : blocks)
          for (int j = blk * bs; j < std::min(n, (blk + 1) * bs); ++j) kl.push_back(ss[size_t(j)]);
        if (sel) (*sel)[size_t(t)][size_t(g)] = std::move(blocks);
      }
    });
  }

  std::vector<float> o(size_t(T) * qd);
  const double scale = 1.0 / std::sqrt(double(hd));
  c.pool.parallel_for(int64_t(T) * nh, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / nh;
      const int h = int(i % nh), g = h / gs;
      const int64_t* slots;
      int n;
      if (s.sparse(l)) {
        const auto& kl = keys[size_t(t * kvh + g)];
        slots = kl.data();
        n = int(kl.size());
      } else {
        slots = p.seq_slots[size_t(p.seq[size_t(t)])].data();
        n = p.pos[size_t(t)] + 1;
      }
      M3_CHECK(n >= 1, "layer {}: token {} head {} attends to no key", l, t, h);
      attend_head(q.data() + t * qd + h * hd, kc + g * hd, vc + g * hd, cs, slots, n, hd, scale,
                  o.data() + t * qd + h * hd);
    }
  });
  std::vector<float> y(size_t(T) * H);
  linear(L.wo, o.data(), qd, T, y.data(), H, c.pool);
  for (size_t i = 0; i < y.size(); ++i) x[i] += y[i];
}

void ffn_block(const ForwardContext& c, int l, int T, float* x) {
  const ModelSpec& s = c.spec;
  const LayerWeights& L = c.w.layers[size_t(l)];
  const int H = s.hidden;
  std::vector<float> y(size_t(T) * H), out(size_t(T) * H);
  norm_rows(c.pool, x, L.post_norm, T, H, s.rms_eps, y.data());
  if (s.moe(l)) moe_forward(s, L, y.data(), T, out.data(), c.pool);
  else mlp_forward(L.dense, y.data(), T, s.swiglu_alpha, s.swiglu_limit, out.data(), c.pool);
  for (size_t i = 0; i < out.size(); ++i) x[i] += out[i];
}

StepOutput forward_step(const ForwardContext& c, const StepPlan& p, SelectionTrace* trace) {
  const ModelSpec& s = c.spec;
  const int T = p.num_tokens, H = s.hidden;
  std::vector<float> x(size_t(T) * H);
  for (int t = 0; t < T; ++t) std::copy_n(c.w.embed.row(p.token_id[size_t(t)]), H, x.data() + size_t(t) * H);
  if (trace) {
    trace->layers.clear();
    trace->blocks.clear();
  }
  for (int l = 0; l < s.num_layers; ++l) {
    std::vector<std::vector<std::vector<int32_t>>>* sel = nullptr;
    if (trace && s.sparse(l)) {
      trace->layers.push_back(l);
      sel = &trace->blocks.emplace_back();
    }
    attention_block(c, l, p, x.data(), sel);
    ffn_block(c, l, T, x.data());
  }
  const int R = int(p.out_tokens.size());
  std::vector<float> xn(size_t(R) * H);
  for (int r = 0; r < R; ++r)
    gemma_rms_norm(x.data() + size_t(p.out_tokens[size_t(r)]) * H, c.w.final_norm.data(), H, s.rms_eps,
                   xn.data() + size_t(r) * H);
  StepOutput out;
  out.vocab = s.vocab_size;
  out.logits.resize(size_t(R) * size_t(s.vocab_size));
  linear(c.w.lm_head, xn.data(), H, R, out.logits.data(), s.vocab_size, c.pool);
  out.first_row = p.first_row;
  out.num_rows = p.num_rows;
  return out;
}

}  // namespace m3::ref
