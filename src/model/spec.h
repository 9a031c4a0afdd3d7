// ModelSpec: the typed form of a MiniMax-M3 checkpoint's config.json (text_config). Parsed once
// (model/config.cpp); everything downstream reads these fields, never the JSON.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace m3 {

// Sanity bounds checked by ModelSpec::validate, far above any real model; they keep derived
// sizes (q_dim, table entries, cache bytes) within int and within memory for hostile configs.
inline constexpr int kMaxLayers = 1 << 14;
inline constexpr int kMaxDim = 1 << 20;      // hidden, MLP widths, index block / top-k
inline constexpr int kMaxHeadDim = 1 << 16;  // head_dim, index_head_dim
inline constexpr int kMaxHeads = 1 << 12;    // query heads
inline constexpr int kMaxExperts = 1 << 14;
inline constexpr int kMaxVocab = 1 << 24;

enum class AttnKind : uint8_t { Full, Sparse };  // full causal attention | MiniMax Sparse Attention
enum class MlpKind : uint8_t { Dense, MoE };

struct ModelSpec {
  int vocab_size = 0;
  int hidden = 0;
  int num_layers = 0;
  int num_heads = 0;       // query heads
  int num_kv_heads = 0;    // KV groups; query head h reads KV head h / (num_heads / num_kv_heads)
  int head_dim = 0;
  int rotary_dim = 0;      // NeoX split-half RoPE on channels [0, rotary_dim) of each head
  double rope_theta = 0;
  float rms_eps = 1e-6f;
  int dense_inter = 0;     // dense MLP width
  int moe_inter = 0;       // routed expert width
  int shared_inter = 0;    // shared expert width (0 = no shared expert)
  int num_experts = 0;
  int top_k = 0;
  float routed_scale = 1.0f;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  int index_heads = 0;     // == num_kv_heads (one index head per KV group)
  int index_dim = 0;
  int index_block = 0;     // tokens per index block (also the paged-cache block size)
  int index_topk = 0;      // blocks kept per group
  int index_local = 1;     // forced local blocks ending at the query's own block
  int max_positions = 0;
  int bos_id = -1, eos_id = -1;
  std::vector<AttnKind> attn;  // per layer
  std::vector<MlpKind> mlp;    // per layer

  bool sparse(int l) const { return attn[size_t(l)] == AttnKind::Sparse; }
  bool moe(int l) const { return mlp[size_t(l)] == MlpKind::MoE; }
  int group_size() const { return num_heads / num_kv_heads; }
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int num_sparse_layers() const;
  int num_moe_layers() const;
  // Throws m3::Error naming the field and value when the math cannot honour the spec.
  void validate() const;
  // The same, with `origin` (a file name, a preset name) leading every message.
  void validate(const std::string& origin) const;
  bool operator==(const ModelSpec&) const = default;
};

// Parses config.json (the whole file; fields nest under "text_config" when present). Accepts the
// released spelling (sparse_attention_config, moe_layer_freq) and the normalized one transformers
// writes (index_*, layer_types, mlp_layer_types, rope_parameters). Errors name the field.
ModelSpec parse_model_spec_json(const std::string& json_text, const std::string& origin = "config.json");
ModelSpec load_model_spec(const std::filesystem::path& model_dir);

}  // namespace m3
