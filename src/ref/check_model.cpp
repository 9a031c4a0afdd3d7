// check_ref_spec / check_ref_weights: field-by-field and tensor-by-tensor shape checks.
#include "ref/check_model.h"

#include <cmath>
#include <string>

#include "core/check.h"

namespace m3::ref {

void check_ref_spec(const ModelSpec& s) {
  M3_CHECK(s.num_layers > 0, "model spec: num_hidden_layers must be > 0, got {}", s.num_layers);
  M3_CHECK(int(s.attn.size()) == s.num_layers, "model spec: {} attention layer types for {} layers", s.attn.size(),
           s.num_layers);
  M3_CHECK(int(s.mlp.size()) == s.num_layers, "model spec: {} mlp layer types for {} layers", s.mlp.size(),
           s.num_layers);
  M3_CHECK(s.vocab_size > 0, "model spec: vocab_size must be > 0, got {}", s.vocab_size);
  M3_CHECK(s.hidden > 0, "model spec: hidden_size must be > 0, got {}", s.hidden);
  M3_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
           "model spec: num_attention_heads {} must be a positive multiple of num_key_value_heads {}", s.num_heads,
           s.num_kv_heads);
  M3_CHECK(s.head_dim > 0, "model spec: head_dim must be > 0, got {}", s.head_dim);
  M3_CHECK(s.rotary_dim >= 0 && s.rotary_dim % 2 == 0 && s.rotary_dim <= s.head_dim,
           "model spec: rotary_dim {} must be even and <= head_dim {}", s.rotary_dim, s.head_dim);
  M3_CHECK(s.rotary_dim == 0 || (std::isfinite(s.rope_theta) && s.rope_theta > 0),
           "model spec: rope_theta must be > 0, got {}", s.rope_theta);
  M3_CHECK(std::isfinite(s.rms_eps) && s.rms_eps >= 0, "model spec: rms_norm_eps must be >= 0, got {}", s.rms_eps);
  M3_CHECK(s.index_block > 0, "model spec: index_block_size (also the cache block size) must be > 0, got {}",
           s.index_block);
  M3_CHECK(s.max_positions >= 0, "model spec: max_position_embeddings must be >= 0, got {}", s.max_positions);
  bool any_sparse = false, any_moe = false, any_dense = false;
  for (int l = 0; l < s.num_layers; ++l) {
    any_sparse |= s.sparse(l);
    any_moe |= s.moe(l);
    any_dense |= !s.moe(l);
  }
  if (any_sparse) {
    M3_CHECK(s.index_heads == s.num_kv_heads, "model spec: index_n_heads {} must equal num_key_value_heads {}",
             s.index_heads, s.num_kv_heads);
    M3_CHECK(s.index_dim > 0, "model spec: index_head_dim must be > 0, got {}", s.index_dim);
    M3_CHECK(s.rotary_dim <= s.index_dim, "model spec: rotary_dim {} must be <= index_head_dim {}", s.rotary_dim,
             s.index_dim);
    M3_CHECK(s.index_topk > 0, "model spec: index_topk_blocks must be > 0, got {}", s.index_topk);
    M3_CHECK(s.index_local >= 0, "model spec: index_local_blocks must be >= 0, got {}", s.index_local);
  }
  if (any_moe) {
    M3_CHECK(s.num_experts > 0 && s.top_k > 0 && s.top_k <= s.num_experts,
             "model spec: num_experts_per_tok {} must be in [1, num_local_experts {}]", s.top_k, s.num_experts);
    M3_CHECK(s.moe_inter > 0, "model spec: intermediate_size (routed expert) must be > 0, got {}", s.moe_inter);
    M3_CHECK(s.shared_inter >= 0, "model spec: shared_intermediate_size must be >= 0, got {}", s.shared_inter);
  }
  if (any_dense) M3_CHECK(s.dense_inter > 0, "model spec: dense_intermediate_size must be > 0, got {}", s.dense_inter);
}

namespace {
void mat(const Mat& m, int rows, int cols, const std::string& name) {
  M3_CHECK(m.rows == rows && m.cols == cols && m.data.size() == size_t(rows) * size_t(cols),
           "weights: {} is [{}, {}] ({} values), expected [{}, {}]", name, m.rows, m.cols, m.data.size(), rows, cols);
}
void vec(const Vec& v, int n, const std::string& name) {
  M3_CHECK(int64_t(v.size()) == n, "weights: {} has {} values, expected {}", name, v.size(), n);
}
void mlp(const MlpWeights& w, int H, int I, const std::string& name) {
  mat(w.gate, I, H, name + ".gate");
  mat(w.up, I, H, name + ".up");
  mat(w.down, H, I, name + ".down");
}
}  // namespace

void check_ref_weights(const ModelSpec& s, const ModelWeights& w, int tp) {
  const int H = s.hidden;
  M3_CHECK(tp >= 1 && s.vocab_size % tp == 0, "weights: vocab_size {} is not split over {} ranks", s.vocab_size, tp);
  mat(w.embed, s.vocab_size, H, "embed_tokens");
  mat(w.lm_head, s.vocab_size / tp, H, tp > 1 ? "lm_head (this rank's rows)" : "lm_head");
  vec(w.final_norm, H, "norm");
  M3_CHECK(int(w.layers.size()) == s.num_layers, "weights: {} layers, spec has {}", w.layers.size(), s.num_layers);
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    std::string p = "layers." + std::to_string(l) + ".";
    vec(L.input_norm, H, p + "input_layernorm");
    vec(L.post_norm, H, p + "post_attention_layernorm");
    mat(L.wq, s.q_dim(), H, p + "self_attn.q_proj");
    mat(L.wk, s.kv_dim(), H, p + "self_attn.k_proj");
    mat(L.wv, s.kv_dim(), H, p + "self_attn.v_proj");
    mat(L.wo, H, s.q_dim(), p + "self_attn.o_proj");
    vec(L.q_norm, s.head_dim, p + "self_attn.q_norm");
    vec(L.k_norm, s.head_dim, p + "self_attn.k_norm");
    if (s.sparse(l)) {
      mat(L.wiq, s.index_heads * s.index_dim, H, p + "self_attn.index_q_proj");
      mat(L.wik, s.index_dim, H, p + "self_attn.index_k_proj");
      vec(L.iq_norm, s.index_dim, p + "self_attn.index_q_norm");
      vec(L.ik_norm, s.index_dim, p + "self_attn.index_k_norm");
    }
    if (s.moe(l)) {
      mat(L.router, s.num_experts, H, p + "block_sparse_moe.gate");
      vec(L.router_bias, s.num_experts, p + "block_sparse_moe.e_score_correction_bias");
      M3_CHECK(int(L.experts.size()) == s.num_experts, "weights: {}block_sparse_moe has {} experts, expected {}", p,
               L.experts.size(), s.num_experts);
      for (int e = 0; e < s.num_experts; ++e)
        mlp(L.experts[size_t(e)], H, s.moe_inter, p + "block_sparse_moe.experts." + std::to_string(e));
      if (s.shared_inter > 0) mlp(L.shared, H, s.shared_inter, p + "block_sparse_moe.shared_experts");
      else
        M3_CHECK(L.shared.gate.empty(), "weights: {}block_sparse_moe.shared_experts present but shared_intermediate_size is 0",
                 p);
    } else {
      mlp(L.dense, H, s.dense_inter, p + "mlp");
    }
  }
}

}  // namespace m3::ref
