// naive_forward(): loops written for clarity, every value in double.
#include "common/naive_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace m3::test {

namespace {
using DVec = std::vector<double>;

DVec matvec(const Mat& m, const DVec& x) {
  DVec y(size_t(m.rows), 0.0);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) y[size_t(r)] += double(m.row(r)[c]) * x[size_t(c)];
  return y;
}

// x / sqrt(mean(x^2) + eps) * (1 + w) over x[off, off + n)
void norm(DVec& x, size_t off, int n, const Vec& w, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[off + size_t(i)] * x[off + size_t(i)];
  double r = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) x[off + size_t(i)] *= r * (1.0 + double(w[size_t(i)]));
}

// Partial NeoX RoPE; the angle follows the project convention (fp32 inverse frequency times the
// position, rounded to fp32), the rotation itself is in double.
void rope(DVec& x, size_t off, int rd, double theta, int pos) {
  int r = rd / 2;
  for (int i = 0; i < r; ++i) {
    float inv = 1.0f / float(std::pow(double(float(theta)), double(float(2 * i) / float(rd))));
    double a = double(float(pos) * inv);
    double c = std::cos(a), s = std::sin(a);
    double x0 = x[off + size_t(i)], x1 = x[off + size_t(i + r)];
    x[off + size_t(i)] = x0 * c - x1 * s;
    x[off + size_t(i + r)] = x1 * c + x0 * s;
  }
}

DVec mlp(const MlpWeights& w, const DVec& y, double alpha, double limit) {
  DVec g = matvec(w.gate, y), u = matvec(w.up, y);
  DVec h(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    double gg = std::min(g[i], limit), uu = std::clamp(u[i], -limit, limit);
    h[i] = (uu + 1.0) * gg / (1.0 + std::exp(-alpha * gg));
  }
  return matvec(w.down, h);
}
}  // namespace

NaiveResult naive_forward(const ModelSpec& s, const ModelWeights& w, const std::vector<int32_t>& tokens,
                          const CacheRound& round) {
  const int T = int(tokens.size()), H = s.hidden, hd = s.head_dim, bs = s.index_block;
  const double eps = s.rms_eps;
  NaiveResult res;
  res.vocab = s.vocab_size;
  std::vector<DVec> x(static_cast<size_t>(T), DVec(static_cast<size_t>(H)));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[size_t(t)][size_t(i)] = w.embed.row(tokens[size_t(t)])[i];

  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    std::vector<DVec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T)), iq(static_cast<size_t>(T)), ik(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
      DVec a = x[size_t(t)];
      norm(a, 0, H, L.input_norm, eps);
      q[size_t(t)] = matvec(L.wq, a);
      k[size_t(t)] = matvec(L.wk, a);
      v[size_t(t)] = matvec(L.wv, a);
      for (int h = 0; h < s.num_heads; ++h) {
        norm(q[size_t(t)], size_t(h * hd), hd, L.q_norm, eps);
        rope(q[size_t(t)], size_t(h * hd), s.rotary_dim, s.rope_theta, t);
      }
      for (int g = 0; g < s.num_kv_heads; ++g) {
        norm(k[size_t(t)], size_t(g * hd), hd, L.k_norm, eps);
        rope(k[size_t(t)], size_t(g * hd), s.rotary_dim, s.rope_theta, t);
      }
      if (s.sparse(l)) {
        iq[size_t(t)] = matvec(L.wiq, a);
        ik[size_t(t)] = matvec(L.wik, a);
        for (int g = 0; g < s.index_heads; ++g) {
          norm(iq[size_t(t)], size_t(g * s.index_dim), s.index_dim, L.iq_norm, eps);
          rope(iq[size_t(t)], size_t(g * s.index_dim), s.rotary_dim, s.rope_theta, t);
        }
        norm(ik[size_t(t)], 0, s.index_dim, L.ik_norm, eps);
        rope(ik[size_t(t)], 0, s.rotary_dim, s.rope_theta, t);
      }
    }
    if (round)
      for (int t = 0; t < T; ++t) {
        for (double& e : k[size_t(t)]) e = round('k', l, e);
        for (double& e : v[size_t(t)]) e = round('v', l, e);
        for (double& e : ik[size_t(t)]) e = round('i', l, e);
      }
    // allowed[t][g][j]: key j visible to the heads of group g at token t
    std::vector<std::vector<std::vector<char>>> allowed(size_t(T), std::vector<std::vector<char>>(size_t(s.num_kv_heads)));
    if (s.sparse(l)) res.blocks.emplace_back(size_t(T), std::vector<std::vector<int32_t>>(size_t(s.num_kv_heads)));
    for (int t = 0; t < T; ++t)
      for (int g = 0; g < s.num_kv_heads; ++g) {
        auto& al = allowed[size_t(t)][size_t(g)];
        al.assign(size_t(t + 1), 1);
        if (!s.sparse(l)) continue;
        int nb = t / bs + 1;
        DVec bsc(size_t(nb), -INFINITY);
        double scale = 0;
        for (int j = 0; j <= t; ++j) {
          double sc = 0;
          for (int i = 0; i < s.index_dim; ++i) sc += iq[size_t(t)][size_t(g * s.index_dim + i)] * ik[size_t(j)][size_t(i)];
          bsc[size_t(j / bs)] = std::max(bsc[size_t(j / bs)], sc);
          scale = std::max(scale, std::fabs(sc));
        }
        std::vector<char> forced(size_t(nb), 0);
        for (int i = 0; i < s.index_local && t / bs - i >= 0; ++i) forced[size_t(t / bs - i)] = 1;
        std::vector<int> order(static_cast<size_t>(nb));
        std::iota(order.begin(), order.end(), 0);
        auto key = [&](int b) { return forced[size_t(b)] ? INFINITY : bsc[size_t(b)]; };
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
        int kk = std::min(s.index_topk, nb);
        std::vector<int32_t> kept(order.begin(), order.begin() + kk);
        if (kk < nb && !forced[size_t(order[size_t(kk - 1)])] && !forced[size_t(order[size_t(kk)])])
          res.min_block_gap = std::min(res.min_block_gap, (bsc[size_t(order[size_t(kk - 1)])] - bsc[size_t(order[size_t(kk)])]) / scale);
        std::sort(kept.begin(), kept.end());
        std::fill(al.begin(), al.end(), 0);
        for (int b : kept)
          for (int j = b * bs; j <= std::min(t, (b + 1) * bs - 1); ++j) al[size_t(j)] = 1;
        res.blocks.back()[size_t(t)][size_t(g)] = kept;
      }
    for (int t = 0; t < T; ++t) {
      DVec o(size_t(s.q_dim()), 0.0);
      for (int h = 0; h < s.num_heads; ++h) {
        int g = h / s.group_size();
        const auto& al = allowed[size_t(t)][size_t(g)];
        DVec sc(size_t(t + 1), -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          if (!al[size_t(j)]) continue;
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[size_t(t)][size_t(h * hd + i)] * k[size_t(j)][size_t(g * hd + i)];
          sc[size_t(j)] = d / std::sqrt(double(hd));
          m = std::max(m, sc[size_t(j)]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += al[size_t(j)] ? std::exp(sc[size_t(j)] - m) : 0.0;
        for (int j = 0; j <= t; ++j) {
          if (!al[size_t(j)]) continue;
          double p = std::exp(sc[size_t(j)] - m) / z;
          for (int i = 0; i < hd; ++i) o[size_t(h * hd + i)] += p * v[size_t(j)][size_t(g * hd + i)];
        }
      }
      DVec y = matvec(L.wo, o);
      for (int i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += y[size_t(i)];
    }
    for (int t = 0; t < T; ++t) {
      DVec y = x[size_t(t)];
      norm(y, 0, H, L.post_norm, eps);
      DVec f(size_t(H), 0.0);
      if (!s.moe(l)) {
        f = mlp(L.dense, y, s.swiglu_alpha, s.swiglu_limit);
      } else {
        DVec r = matvec(L.router, y), sg(r.size()), ch(r.size());
        for (size_t e = 0; e < r.size(); ++e) {
          sg[e] = 1.0 / (1.0 + std::exp(-r[e]));
          ch[e] = sg[e] + double(L.router_bias[e]);
        }
        std::vector<int> order(r.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ch[size_t(a)] > ch[size_t(b)]; });
        if (s.top_k < s.num_experts)
          res.min_router_gap = std::min(res.min_router_gap, ch[size_t(order[size_t(s.top_k - 1)])] - ch[size_t(order[size_t(s.top_k)])]);
        double sum = 0;
        for (int i = 0; i < s.top_k; ++i) sum += sg[size_t(order[size_t(i)])];
        for (int i = 0; i < s.top_k; ++i) {
          int e = order[size_t(i)];
          DVec out = mlp(L.experts[size_t(e)], y, s.swiglu_alpha, s.swiglu_limit);
          double wgt = sg[size_t(e)] / sum * s.routed_scale;
          for (int j = 0; j < H; ++j) f[size_t(j)] += wgt * out[size_t(j)];
        }
        if (s.shared_inter > 0) {
          DVec out = mlp(L.shared, y, s.swiglu_alpha, s.swiglu_limit);
          for (int j = 0; j < H; ++j) f[size_t(j)] += out[size_t(j)];
        }
      }
      for (int i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += f[size_t(i)];
    }
  }
  res.logits.resize(size_t(T) * size_t(s.vocab_size));
  for (int t = 0; t < T; ++t) {
    DVec y = x[size_t(t)];
    norm(y, 0, H, w.final_norm, eps);
    DVec lg = matvec(w.lm_head, y);
    std::copy(lg.begin(), lg.end(), res.logits.begin() + ptrdiff_t(size_t(t) * size_t(s.vocab_size)));
  }
  return res;
}

}  // namespace m3::test
