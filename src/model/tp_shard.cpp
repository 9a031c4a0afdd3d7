// tp_rank_spec / tp_rank_weights (model/tp_shard.h).
#include "model/tp_shard.h"

#include <algorithm>

#include "core/check.h"
#include "model/prepare.h"

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

ModelWeights tp_rank_weights(const ModelSpec& spec, const WeightSource& src, int rank, int tp) {
  const ModelSpec rs = tp_rank_spec(spec, tp);
  M3_CHECK(rank >= 0 && rank < tp, "tensor parallelism: rank {} of {}", rank, tp);
  const int H = spec.hidden;
  auto mat = [&](WeightRole role, int layer, int expert, int r0, int nr, int c0, int nc) {
    Mat m(nr, nc);
    src.read_rows(WeightKey{role, layer, expert}, r0, nr, c0, nc, m.data.data());
    return m;
  };
  auto vec = [&](WeightRole role, int layer, int n) {
    Vec v(static_cast<size_t>(n));
    src.read_rows(WeightKey{role, layer, -1}, 0, 1, 0, n, v.data());
    return v;
  };
  // gate / up by rows, down by columns: this rank's share [rank I, (rank + 1) I) of the width
  auto mlp = [&](WeightRole gate, WeightRole up, WeightRole down, int layer, int expert, int width) {
    const int I = width / tp;
    return MlpWeights{mat(gate, layer, expert, rank * I, I, 0, H), mat(up, layer, expert, rank * I, I, 0, H),
                      mat(down, layer, expert, 0, H, rank * I, I)};
  };
  ModelWeights o;
  o.embed = mat(WeightRole::Embed, -1, -1, 0, spec.vocab_size, 0, H);
  const int V = spec.vocab_size / tp;
  o.lm_head = mat(WeightRole::LmHead, -1, -1, rank * V, V, 0, H);
  o.final_norm = vec(WeightRole::FinalNorm, -1, H);
  const int qr = rs.q_dim(), kr = rs.kv_dim(), iqr = rs.index_heads * rs.index_dim;
  // the rank's first KV (and index) head: its slice, or the one replicated head its queries use
  const int kv0 = tp_rank_kv_head(spec, rank, tp);
  for (int l = 0; l < spec.num_layers; ++l) {
    LayerWeights R;
    R.input_norm = vec(WeightRole::InputNorm, l, H);
    R.post_norm = vec(WeightRole::PostNorm, l, H);
    R.q_norm = vec(WeightRole::QNorm, l, spec.head_dim);
    R.k_norm = vec(WeightRole::KNorm, l, spec.head_dim);
    R.wq = mat(WeightRole::Wq, l, -1, rank * qr, qr, 0, H);
    R.wk = mat(WeightRole::Wk, l, -1, kv0 * spec.head_dim, kr, 0, H);
    R.wv = mat(WeightRole::Wv, l, -1, kv0 * spec.head_dim, kr, 0, H);
    R.wo = mat(WeightRole::Wo, l, -1, 0, H, rank * qr, qr);
    if (spec.sparse(l)) {
      R.wiq = mat(WeightRole::IndexWq, l, -1, kv0 * spec.index_dim, iqr, 0, H);
      R.wik = mat(WeightRole::IndexWk, l, -1, 0, spec.index_dim, 0, H);
      R.iq_norm = vec(WeightRole::IndexQNorm, l, spec.index_dim);
      R.ik_norm = vec(WeightRole::IndexKNorm, l, spec.index_dim);
    }
    if (spec.moe(l)) {
      R.router = mat(WeightRole::Router, l, -1, 0, spec.num_experts, 0, H);
      R.router_bias = vec(WeightRole::RouterBias, l, spec.num_experts);
      for (int e = 0; e < spec.num_experts; ++e)
        R.experts.push_back(mlp(WeightRole::ExpertGate, WeightRole::ExpertUp, WeightRole::ExpertDown, l, e, spec.moe_inter));
      if (spec.shared_inter > 0)
        R.shared = mlp(WeightRole::SharedGate, WeightRole::SharedUp, WeightRole::SharedDown, l, -1, spec.shared_inter);
    } else {
      R.dense = mlp(WeightRole::DenseGate, WeightRole::DenseUp, WeightRole::DenseDown, l, -1, spec.dense_inter);
    }
    o.layers.push_back(std::move(R));
  }
  return o;
}

ModelWeights tp_rank_weights(const ModelSpec& spec, const ModelWeights& w, int rank, int tp) {
  M3_CHECK(w.layers.size() == size_t(spec.num_layers), "tensor parallelism: {} weight layers for a {}-layer model",
           w.layers.size(), spec.num_layers);
  return tp_rank_weights(spec, *make_weight_source(w), rank, tp);
}

}  // namespace m3
