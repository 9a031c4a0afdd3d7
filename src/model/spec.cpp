// ModelSpec helpers and validation: the checks that say whether the math of m3-model.md can be
// computed for a spec, whichever way it was made (config.json, a synthetic preset, a test).
// Messages name the config.json field (normalized spelling, the released one in parentheses
// where it differs) and the offending value.
#include "model/spec.h"

#include <cmath>

#include "core/check.h"

namespace m3 {

int ModelSpec::num_sparse_layers() const {
  int n = 0;
  for (auto k : attn) n += k == AttnKind::Sparse;
  return n;
}

int ModelSpec::num_moe_layers() const {
  int n = 0;
  for (auto k : mlp) n += k == MlpKind::MoE;
  return n;
}

void ModelSpec::validate() const { validate("ModelSpec"); }

void ModelSpec::validate(const std::string& origin) const {
  const char* o = origin.c_str();
  auto positive = [&](int v, const char* field) {
    M3_CHECK(v > 0, "{}: {} must be > 0, got {}", o, field, v);
  };
  auto at_most = [&](int v, int limit, const char* field) {
    M3_CHECK(v <= limit, "{}: {} = {} exceeds the sanity limit {}", o, field, v, limit);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden, "hidden_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(rotary_dim, "rotary_dim");
  at_most(vocab_size, kMaxVocab, "vocab_size");
  at_most(hidden, kMaxDim, "hidden_size");
  at_most(num_layers, kMaxLayers, "num_hidden_layers");
  at_most(num_heads, kMaxHeads, "num_attention_heads");
  at_most(head_dim, kMaxHeadDim, "head_dim");
  at_most(dense_inter, kMaxDim, "dense_intermediate_size");
  at_most(moe_inter, kMaxDim, "intermediate_size");
  at_most(shared_inter, kMaxDim, "shared_intermediate_size");
  at_most(num_experts, kMaxExperts, "num_local_experts");
  at_most(index_dim, kMaxHeadDim, "index_head_dim (sparse_index_dim)");
  at_most(index_block, kMaxDim, "index_block_size (sparse_block_size)");
  at_most(index_topk, kMaxDim, "index_topk_blocks (sparse_topk_blocks)");
  M3_CHECK(num_heads % num_kv_heads == 0,
           "{}: num_attention_heads ({}) is not divisible by num_key_value_heads ({})", o, num_heads,
           num_kv_heads);
  // NeoX split-half RoPE pairs channel i with i + rotary_dim/2: an odd width has no partner.
  M3_CHECK(rotary_dim % 2 == 0, "{}: rotary_dim must be even, got {}", o, rotary_dim);
  M3_CHECK(rotary_dim <= head_dim, "{}: rotary_dim ({}) > head_dim ({})", o, rotary_dim, head_dim);
  M3_CHECK(std::isfinite(rope_theta) && rope_theta > 1.0, "{}: rope_theta must be finite and > 1, got {}", o,
           rope_theta);
  M3_CHECK(std::isfinite(rms_eps) && rms_eps > 0, "{}: rms_norm_eps must be finite and > 0, got {}", o, rms_eps);
  M3_CHECK(max_positions >= 0, "{}: max_position_embeddings must be >= 0, got {}", o, max_positions);
  M3_CHECK(std::isfinite(swiglu_alpha), "{}: swiglu_alpha must be finite, got {}", o, swiglu_alpha);
  M3_CHECK(std::isfinite(swiglu_limit) && swiglu_limit > 0, "{}: swiglu_limit must be finite and > 0, got {}", o,
           swiglu_limit);

  M3_CHECK(attn.size() == size_t(num_layers), "{}: layer_types (sparse_attention_freq) has {} entries, "
           "num_hidden_layers is {}", o, attn.size(), num_layers);
  M3_CHECK(mlp.size() == size_t(num_layers), "{}: mlp_layer_types (moe_layer_freq) has {} entries, "
           "num_hidden_layers is {}", o, mlp.size(), num_layers);

  if (num_moe_layers() < num_layers) positive(dense_inter, "dense_intermediate_size");
  if (num_moe_layers() > 0) {
    positive(moe_inter, "intermediate_size");
    positive(num_experts, "num_local_experts");
    positive(top_k, "num_experts_per_tok");
    M3_CHECK(top_k <= num_experts, "{}: num_experts_per_tok ({}) > num_local_experts ({})", o, top_k, num_experts);
    M3_CHECK(shared_inter >= 0, "{}: shared_intermediate_size must be >= 0, got {}", o, shared_inter);
    M3_CHECK(std::isfinite(routed_scale) && routed_scale > 0, "{}: routed_scaling_factor must be finite and > 0, got {}",
             o, routed_scale);
  }

  if (num_sparse_layers() > 0) {
    positive(index_heads, "index_n_heads (sparse_num_index_heads)");
    at_most(index_heads, kMaxHeads, "index_n_heads (sparse_num_index_heads)");
    positive(index_dim, "index_head_dim (sparse_index_dim)");
    positive(index_block, "index_block_size (sparse_block_size)");
    positive(index_topk, "index_topk_blocks (sparse_topk_blocks)");
    // One index head per KV group: group g's selection serves the query heads of KV head g.
    M3_CHECK(index_heads == num_kv_heads,
             "{}: index_n_heads (sparse_num_index_heads) = {} must equal num_key_value_heads = {}", o, index_heads,
             num_kv_heads);
    // The indexer applies the same partial RoPE to its own heads.
    M3_CHECK(rotary_dim <= index_dim, "{}: rotary_dim ({}) > index_head_dim (sparse_index_dim) ({})", o, rotary_dim,
             index_dim);
    M3_CHECK(index_local >= 0 && index_local <= index_topk,
             "{}: index_local_blocks (sparse_local_block) = {} must be in [0, index_topk_blocks = {}]", o, index_local,
             index_topk);
  }
}

}  // namespace m3
