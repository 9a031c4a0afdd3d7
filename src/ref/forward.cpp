// attention_block / ffn_block / forward_step. Parallel loops are over tokens, (token, group) or
// (token, head); each output element is produced by one iteration with a fixed order, so results
// do not depend on the thread count, the batch composition or how a prompt is chunked.
#include "ref/forward.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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

void attention_block(const ForwardContext& c, int l, const StepPlan& p, float* x, const AttentionChoices& ch) {
  BlockChoices* sel = ch.sel;
  const BlockChoices* offered = ch.offered;
  const ModelSpec& s = c.spec;
  const LayerWeights& L = c.w.layers[size_t(l)];
  const int T = p.num_tokens, H = s.hidden, hd = s.head_dim, nh = s.num_heads, kvh = s.num_kv_heads;
  const int qd = s.q_dim(), kvd = s.kv_dim(), gs = s.group_size();
  const int64_t cs = c.cache.kv_stride();
  float* kc = c.cache.k(l);
  float* vc = c.cache.v(l);
  const CacheCodec kcod = c.codecs ? c.codecs->k[size_t(l)] : CacheCodec{};
  const CacheCodec vcod = c.codecs ? c.codecs->v[size_t(l)] : CacheCodec{};
  // offered cache entries: checked, then followed per element (per-token counts, merged in order)
  const double ctol = c.follow ? c.follow->opt.cache_tie_rel : 0;
  auto check_rows = [&](const std::vector<float>* rows, int width, const char* what) {
    M3_CHECK(!rows || (c.follow && c.follow->stats && rows->size() == size_t(T) * size_t(width)),
             "layer {}: offered {} cache entries: {} values for {} tokens of {}", l, what, rows ? rows->size() : 0, T,
             width);
  };
  check_rows(ch.k_in, kvd, "K");
  check_rows(ch.v_in, kvd, "V");
  struct TokenCache {
    FollowCount n;
    int first = -1;  // first refused element: kind * 2^20 + index (kind 0 K, 1 V, 2 index-K)
    double gap = 0;
  };
  std::vector<TokenCache> tc(static_cast<size_t>(T));
  auto store = [&](const CacheCodec& cod, const float* src, int n, const std::vector<float>* in, int64_t t, int64_t off,
                   float* dst, int kind) {
    TokenCache& r = tc[size_t(t)];
    int first = -1;
    double gap = 0;
    store_following(cod, src, n, in ? in->data() + t * int64_t(in->size() / size_t(T)) + off : nullptr, ctol, dst, r.n,
                    &first, &gap);
    if (first >= 0 && r.first < 0) {
      r.first = kind * (1 << 20) + int(off) + first;
      r.gap = gap;
    }
  };
  auto merge_cache = [&] {
    if (!c.follow || !c.follow->stats) return;
    FollowStats& st = *c.follow->stats;
    for (int64_t t = 0; t < T; ++t) {
      st.cache.merge(tc[size_t(t)].n);
      if (tc[size_t(t)].first >= 0 && st.first_refused.empty()) {
        const int kind = tc[size_t(t)].first >> 20, i = tc[size_t(t)].first & ((1 << 20) - 1);
        st.first_refused = fmt::format("layer {} token {}: {} cache element {} offered a rounding that is not a "
                                       "near-tie, relative gap {:.3g}",
                                       l, t, kind == 0 ? "K" : kind == 1 ? "V" : "index-K", i, tc[size_t(t)].gap);
      }
      tc[size_t(t)] = TokenCache{};
    }
  };

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
      for (int g = 0; g < kvh; ++g) {  // per head: the cache rule's vector
        store(kcod, k.data() + t * kvd + g * hd, hd, ch.k_in, t, g * hd, kc + slot * cs + g * hd, 0);
        store(vcod, v.data() + t * kvd + g * hd, hd, ch.v_in, t, g * hd, vc + slot * cs + g * hd, 1);
      }
    }
  });

  merge_cache();
  for (auto [out, cache] : {std::pair{ch.k_out, kc}, std::pair{ch.v_out, vc}})
    if (out) {
      out->resize(size_t(T) * kvd);
      for (int64_t t = 0; t < T; ++t) std::copy_n(cache + p.slot[size_t(t)] * cs, kvd, out->data() + t * kvd);
    }

  // MSA: per (token, group) the key slots to attend over
  std::vector<std::vector<int64_t>> keys;
  if (s.sparse(l)) {
    const int id = s.index_dim, ih = s.index_heads, bs = c.cache.block_size();
    const int64_t is = c.cache.ik_stride();
    float* ikc = c.cache.ik(l);
    const CacheCodec ikcod = c.codecs ? c.codecs->ik[size_t(l)] : CacheCodec{};
    check_rows(ch.ik_in, id, "index-K");
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
        store(ikcod, kt, id, ch.ik_in, t, 0, ikc + p.slot[size_t(t)] * is, 2);
      }
    });
    merge_cache();
    if (ch.ik_out) {
      ch.ik_out->resize(size_t(T) * id);
      for (int64_t t = 0; t < T; ++t) std::copy_n(ikc + p.slot[size_t(t)] * is, id, ch.ik_out->data() + t * id);
    }
    keys.resize(size_t(T) * kvh);
    if (sel) sel->assign(size_t(T), std::vector<std::vector<int32_t>>(size_t(kvh)));
    if (offered) {
      M3_CHECK(c.follow && c.follow->stats && offered->size() == size_t(T),
               "layer {}: {} offered block choices for {} tokens", l, offered->size(), T);
      for (const auto& row : *offered)
        M3_CHECK(row.size() == size_t(kvh), "layer {}: offered block choices of {} groups, the model has {}", l,
                 row.size(), kvh);
    }
    // per (token, group): -1 = nothing offered or the offered set is the own one, else its gap
    std::vector<double> gaps(offered ? size_t(T) * kvh : 0, -1.0);
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
        if (offered) {
          std::vector<int32_t> off = (*offered)[size_t(t)][size_t(g)];
          std::sort(off.begin(), off.end());
          if (off != blocks) {
            const float* iqg = iq.data() + (t * ih + g) * id;
            auto magnitude = [&](int b) {  // sum |iq_d ik_d| of the key attaining block b's maximum
              int jm = b * bs;
              for (int j = b * bs; j < std::min(n, (b + 1) * bs); ++j)
                if (scores[size_t(j)] > scores[size_t(jm)]) jm = j;
              const float* kr = ikc + ss[size_t(jm)] * is;
              double m = 0;
              for (int d = 0; d < id; ++d) m += std::fabs(double(iqg[d]) * double(kr[d]));
              return m;
            };
            const double gap = block_choice_gap(bsc.data(), int(bsc.size()), pos / bs, s.index_topk, s.index_local,
                                                off, magnitude);
            gaps[size_t(i)] = gap;
            if (gap <= c.follow->opt.block_tie_rel) blocks = std::move(off);
          }
        }
        auto& kl = keys[size_t(i)];
        for (int32_t blk : blocks)
          for (int j = blk * bs; j < std::min(n, (blk + 1) * bs); ++j) kl.push_back(ss[size_t(j)]);
        if (sel) (*sel)[size_t(t)][size_t(g)] = std::move(blocks);
      }
    });
    if (offered) {
      FollowStats& st = *c.follow->stats;
      for (size_t i = 0; i < gaps.size(); ++i) {
        ++st.block_sets;
        const double gap = gaps[i];
        if (gap < 0) continue;
        ++st.block_differ;
        if (gap <= c.follow->opt.block_tie_rel) {
          ++st.block_followed;
          st.block_max_taken = std::max(st.block_max_taken, gap);
        } else {
          ++st.block_refused;
          st.block_min_refused = std::min(st.block_min_refused, gap);
          if (st.first_refused.empty())
            st.first_refused = fmt::format("layer {} token {} group {}: offered blocks not a near-tie, relative gap {:.3g}",
                                           l, i / size_t(kvh), i % size_t(kvh), gap);
        }
      }
    }
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
  if (c.comm) c.comm->all_reduce_sum(y.data(), y.size());  // this rank's heads' share of every output
  for (size_t i = 0; i < y.size(); ++i) x[i] += y[i];
}

void ffn_block(const ForwardContext& c, int l, int T, float* x, ExpertChoices* experts, const ExpertChoices* offered) {
  const ModelSpec& s = c.spec;
  const LayerWeights& L = c.w.layers[size_t(l)];
  const int H = s.hidden;
  std::vector<float> y(size_t(T) * H), out(size_t(T) * H);
  norm_rows(c.pool, x, L.post_norm, T, H, s.rms_eps, y.data());
  if (c.ffn_tap && *c.ffn_tap) (*c.ffn_tap)(l, y.data(), T);
  if (s.moe(l)) {
    MoeChoices mc;
    mc.offered = offered;
    if (offered) {
      M3_CHECK(c.follow && c.follow->stats, "layer {}: expert choices offered without a follow context", l);
      mc.tie_rel = c.follow->opt.expert_tie_rel;
      mc.stats = c.follow->stats;
    }
    mc.layer = l;
    mc.chosen = experts;
    moe_forward(s, L, y.data(), T, out.data(), c.pool, &mc);
  } else mlp_forward(L.dense, y.data(), T, s.swiglu_alpha, s.swiglu_limit, out.data(), c.pool);
  if (c.comm) c.comm->all_reduce_sum(out.data(), out.size());  // this rank's share of the widths
  for (size_t i = 0; i < out.size(); ++i) x[i] += out[i];
}

StepOutput forward_step(const ForwardContext& c, const StepPlan& p, SelectionTrace* trace) {
  const ModelSpec& s = c.spec;
  const int T = p.num_tokens, H = s.hidden;
  std::vector<float> x(size_t(T) * H);
  for (int t = 0; t < T; ++t) std::copy_n(c.w.embed.row(p.token_id[size_t(t)]), H, x.data() + size_t(t) * H);
  if (trace) {
    trace->clear();
    if (trace->record_cache) {
      trace->cache_k.resize(size_t(s.num_layers));
      trace->cache_v.resize(size_t(s.num_layers));
      trace->cache_ik.resize(size_t(s.num_layers));
    }
  }
  const SelectionTrace* d = c.follow ? c.follow->decisions : nullptr;
  // Auxiliary hidden states: the residual stream entering layer l, copied for the tokens that ask.
  const int naux = int(p.aux_layers.size());
  std::vector<float> aux(p.aux_tokens.size() * size_t(naux) * size_t(H));
  auto capture_aux = [&](int l) {
    for (int k = 0; k < naux; ++k) {
      if (p.aux_layers[size_t(k)] != l) continue;
      for (size_t r = 0; r < p.aux_tokens.size(); ++r)
        std::copy_n(x.data() + size_t(p.aux_tokens[r]) * H, H, aux.data() + (r * naux + size_t(k)) * H);
    }
  };
  // Index of layer l in the offered choices of one kind (-1: none of that kind offered).
  auto offered_index = [](const std::vector<int>& layers, size_t parts, int l, const char* what) -> int {
    if (parts == 0) return -1;
    M3_CHECK(layers.size() == parts, "follow: the decisions list {} layers for {} {} entries", layers.size(), parts, what);
    auto it = std::find(layers.begin(), layers.end(), l);
    M3_CHECK(it != layers.end(), "follow: the decisions offer {} but none for layer {}", what, l);
    return int(it - layers.begin());
  };
  for (int l = 0; l < s.num_layers; ++l) {
    capture_aux(l);
    BlockChoices* sel = nullptr;
    if (trace && s.sparse(l)) {
      trace->layers.push_back(l);
      sel = &trace->blocks.emplace_back();
    }
    const int kb = d && s.sparse(l) ? offered_index(d->layers, d->blocks.size(), l, "blocks") : -1;
    AttentionChoices ac;
    ac.sel = sel;
    ac.offered = kb >= 0 ? &d->blocks[size_t(kb)] : nullptr;
    if (trace && trace->record_cache) {
      ac.k_out = &trace->cache_k[size_t(l)];
      ac.v_out = &trace->cache_v[size_t(l)];
      if (s.sparse(l)) ac.ik_out = &trace->cache_ik[size_t(l)];
    }
    if (d && !d->cache_k.empty()) {  // offered cache entries: every layer's
      M3_CHECK(d->cache_k.size() == size_t(s.num_layers) && d->cache_v.size() == size_t(s.num_layers) &&
                   d->cache_ik.size() == size_t(s.num_layers),
               "follow: the decisions hold cache entries of {} / {} / {} layers, the model has {}", d->cache_k.size(),
               d->cache_v.size(), d->cache_ik.size(), s.num_layers);
      ac.k_in = &d->cache_k[size_t(l)];
      ac.v_in = &d->cache_v[size_t(l)];
      if (s.sparse(l)) ac.ik_in = &d->cache_ik[size_t(l)];
    }
    attention_block(c, l, p, x.data(), ac);
    ExpertChoices* ex = nullptr;
    if (trace && s.moe(l)) {
      trace->moe_layers.push_back(l);
      ex = &trace->experts.emplace_back();
    }
    const int ke = d && s.moe(l) ? offered_index(d->moe_layers, d->experts.size(), l, "experts") : -1;
    ffn_block(c, l, T, x.data(), ex, ke >= 0 ? &d->experts[size_t(ke)] : nullptr);
  }
  capture_aux(s.num_layers);
  const int R = int(p.out_tokens.size());
  std::vector<float> xn(size_t(R) * H);
  for (int r = 0; r < R; ++r)
    gemma_rms_norm(x.data() + size_t(p.out_tokens[size_t(r)]) * H, c.w.final_norm.data(), H, s.rms_eps,
                   xn.data() + size_t(r) * H);
  StepOutput out;
  out.vocab = s.vocab_size;
  out.logits.resize(size_t(R) * size_t(s.vocab_size));
  if (!c.comm) {
    linear(c.w.lm_head, xn.data(), H, R, out.logits.data(), s.vocab_size, c.pool);
  } else {  // this rank's vocabulary rows, then every rank's in rank order
    const int N = c.comm->size(), Vr = c.w.lm_head.rows;
    M3_CHECK(Vr * N == s.vocab_size, "tensor parallelism: lm_head has {} rows on each of {} ranks, vocab_size is {}", Vr,
             N, s.vocab_size);
    std::vector<float> mine(size_t(R) * size_t(Vr)), all(size_t(N) * mine.size());
    linear(c.w.lm_head, xn.data(), H, R, mine.data(), Vr, c.pool);
    c.comm->all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < N; ++k)
        std::copy_n(all.data() + (size_t(k) * R + r) * Vr, Vr,
                    out.logits.data() + size_t(r) * s.vocab_size + size_t(k) * Vr);
  }
  out.first_row = p.first_row;
  out.num_rows = p.num_rows;
  if (naux > 0) {
    out.aux = std::move(aux);
    out.aux_width = naux * H;
    out.aux_first_row = p.aux_first_row;
  }
  return out;
}

}  // namespace m3::ref
