// tp_rank_spec / tp_rank_weights (model/tp_shard.h).
#include "model/tp_shard.h"

#include <algorithm>

#include "core/check.h"

namespace m3 {

ModelSpec tp_rank_spec(const ModelSpec& spec, int tp, const std::string& origin) {
  M3_CHECK(tp >= 1, "{}: the tensor-parallel size must be >= 1, got {}", origin, tp);
  spec.validate();
  ModelSpec s = spec;
  if (tp == 1) return s;
  auto div = [&](int& v, const char* field) {
    if (v == 0) return;
    M3_CHECK(v % tp == 0, "{} {}: {} = {} is not divisible by {}", origin, tp, field, v, tp);
    v /= tp;
  };
  div(s.num_heads, "num_attention_heads");
  // KV heads (and the index heads, one per KV head): split when tp divides them, else replicated
  // when they divide tp (each rank the one its query heads use), else no split exists
  auto kv = [&](int& v, const char* field) {
    if (v == 0 || v % tp == 0) return div(v, field);
    M3_CHECK(tp % v == 0, "{} {}: {} = {} is neither divisible by {} nor a divisor of it (KV heads are split or "
             "replicated)", origin, tp, field, v, tp);
    v = 1;
  };
  kv(s.num_kv_heads, "num_key_value_heads");
  if (s.num_sparse_layers() > 0) kv(s.index_heads, "index_n_heads");
  if (s.num_moe_layers() < s.num_layers) div(s.dense_inter, "dense_intermediate_size");
  if (s.num_moe_layers() > 0) div(s.moe_inter, "intermediate_size");
  div(s.shared_inter, "shared_intermediate_size");
  M3_CHECK(spec.vocab_size % tp == 0, "{} {}: vocab_size = {} is not divisible by {} (lm_head is split by rows)",
           origin, tp, spec.vocab_size, tp);
  s.validate(origin + " " + std::to_string(tp));
  return s;
}

int tp_rank_kv_head(const ModelSpec& spec, int rank, int tp) {
  const int KV = spec.num_kv_heads;
  return KV % tp == 0 ? rank * (KV / tp) : rank / (tp / KV);
}

namespace {

Mat rows(const Mat& m, int r0, int n) {
  Mat o(n, m.cols);
  std::copy_n(m.row(r0), size_t(n) * size_t(m.cols), o.data.data());
  return o;
}
Mat cols(const Mat& m, int c0, int n) {
  Mat o(m.rows, n);
  for (int r = 0; r < m.rows; ++r) std::copy_n(m.row(r) + c0, n, o.row(r));
  return o;
}
MlpWeights mlp(const MlpWeights& w, int rank, int tp) {
  if (w.gate.empty()) return {};
  const int I = w.gate.rows / tp;
  return MlpWeights{rows(w.gate, rank * I, I), rows(w.up, rank * I, I), cols(w.down, rank * I, I)};
}

}  // namespace

ModelWeights tp_rank_weights(const ModelSpec& spec, const ModelWeights& w, int rank, int tp) {
  const ModelSpec rs = tp_rank_spec(spec, tp);
  M3_CHECK(rank >= 0 && rank < tp, "tensor parallelism: rank {} of {}", rank, tp);
  M3_CHECK(w.layers.size() == size_t(spec.num_layers), "tensor parallelism: {} weight layers for a {}-layer model",
           w.layers.size(), spec.num_layers);
  ModelWeights o;
  o.embed = w.embed;
  const int V = spec.vocab_size / tp;
  o.lm_head = rows(w.lm_head, rank * V, V);
  o.final_norm = w.final_norm;
  const int qr = rs.q_dim(), kr = rs.kv_dim(), iqr = rs.index_heads * rs.index_dim;
  // the rank's first KV (and index) head: its slice, or the one replicated head its queries use
  const int kv0 = tp_rank_kv_head(spec, rank, tp), iq0 = spec.index_heads > 0 ? kv0 : 0;
  for (int l = 0; l < spec.num_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    LayerWeights R;
    R.input_norm = L.input_norm;
    R.post_norm = L.post_norm;
    R.q_norm = L.q_norm;
    R.k_norm = L.k_norm;
    R.wq = rows(L.wq, rank * qr, qr);
    R.wk = rows(L.wk, kv0 * spec.head_dim, kr);
    R.wv = rows(L.wv, kv0 * spec.head_dim, kr);
    R.wo = cols(L.wo, rank * qr, qr);
    if (spec.sparse(l)) {
      R.wiq = rows(L.wiq, iq0 * spec.index_dim, iqr);
      R.wik = L.wik;
      R.iq_norm = L.iq_norm;
      R.ik_norm = L.ik_norm;
    }
    if (spec.moe(l)) {
      R.router = L.router;
      R.router_bias = L.router_bias;
      for (const MlpWeights& e : L.experts) R.experts.push_back(mlp(e, rank, tp));
      R.shared = mlp(L.shared, rank, tp);
    } else {
      R.dense = mlp(L.dense, rank, tp);
    }
    o.layers.push_back(std::move(R));
  }
  return o;
}

}  // namespace m3
