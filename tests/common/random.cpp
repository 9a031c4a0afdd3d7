// Random specs, weights and vectors for tests (see random.h for the scales and why).
#include "common/random.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace m3::test {

uint64_t fresh_seed() {
  if (const char* s = std::getenv("M3_TEST_SEED"); s && *s) return std::stoull(s);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

void fill_normal(std::span<float> x, std::mt19937_64& rng, float stddev, float mean) {
  std::normal_distribution<float> d(mean, stddev);
  for (auto& v : x) v = d(rng);
}

std::vector<float> random_vector(size_t n, std::mt19937_64& rng, float stddev) {
  std::vector<float> v(n);
  fill_normal(v, rng, stddev);
  return v;
}

ModelSpec small_spec() {
  ModelSpec s;
  s.vocab_size = 101;
  s.hidden = 48;
  s.num_layers = 3;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 16;
  s.rotary_dim = 8;
  s.rope_theta = 10000.0;
  s.rms_eps = 1e-6f;
  s.dense_inter = 40;
  s.moe_inter = 24;
  s.shared_inter = 24;
  s.num_experts = 6;
  s.top_k = 2;
  s.routed_scale = 2.0f;
  s.index_heads = 2;
  s.index_dim = 16;
  s.index_block = 4;
  s.index_topk = 3;
  s.index_local = 1;
  s.max_positions = 1024;
  s.attn = {AttnKind::Full, AttnKind::Sparse, AttnKind::Sparse};
  s.mlp = {MlpKind::Dense, MlpKind::MoE, MlpKind::MoE};
  return s;
}

ModelSpec random_spec(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ModelSpec s;
  s.vocab_size = pick(20, 120);
  s.hidden = 8 * pick(3, 8);
  s.num_layers = pick(2, 4);
  s.num_kv_heads = pick(1, 3);
  s.num_heads = s.num_kv_heads * pick(1, 3);
  s.head_dim = pick(0, 1) ? 16 : 8;
  s.rotary_dim = 2 * pick(0, s.head_dim / 2);
  s.rope_theta = pick(0, 1) ? 10000.0 : 5e6;
  s.dense_inter = 8 * pick(2, 6);
  s.moe_inter = 8 * pick(1, 3);
  s.shared_inter = pick(0, 1) ? 8 * pick(1, 3) : 0;
  s.num_experts = pick(3, 8);
  s.top_k = pick(1, std::min(4, s.num_experts));
  s.routed_scale = pick(0, 1) ? 2.0f : 1.0f;
  s.index_heads = s.num_kv_heads;
  s.index_dim = std::max(s.rotary_dim, 8 * pick(1, 2));
  s.index_block = pick(2, 8);
  s.index_topk = pick(1, 4);
  s.index_local = pick(1, 2);
  s.max_positions = 2048;
  for (int l = 0; l < s.num_layers; ++l) {
    s.attn.push_back(pick(0, 2) ? AttnKind::Sparse : AttnKind::Full);
    s.mlp.push_back(pick(0, 1) ? MlpKind::MoE : MlpKind::Dense);
  }
  s.attn[size_t(pick(0, s.num_layers - 1))] = AttnKind::Sparse;
  return s;
}

namespace {
Mat rand_mat(int rows, int cols, std::mt19937_64& rng) {
  Mat m(rows, cols);
  fill_normal(m.data, rng, 1.0f / std::sqrt(float(cols)));
  return m;
}
Vec rand_norm(int n, std::mt19937_64& rng) { return random_vector(size_t(n), rng, 0.2f); }
MlpWeights rand_mlp(int H, int I, std::mt19937_64& rng) {
  MlpWeights w;
  w.gate = rand_mat(I, H, rng);
  w.up = rand_mat(I, H, rng);
  w.down = rand_mat(H, I, rng);
  return w;
}
}  // namespace

ModelWeights make_random_weights(const ModelSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int H = s.hidden;
  ModelWeights w;
  w.embed = Mat(s.vocab_size, H);
  fill_normal(w.embed.data, rng, 1.0f);
  w.lm_head = rand_mat(s.vocab_size, H, rng);
  w.final_norm = rand_norm(H, rng);
  for (int l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    L.input_norm = rand_norm(H, rng);
    L.post_norm = rand_norm(H, rng);
    L.wq = rand_mat(s.q_dim(), H, rng);
    L.wk = rand_mat(s.kv_dim(), H, rng);
    L.wv = rand_mat(s.kv_dim(), H, rng);
    L.wo = rand_mat(H, s.q_dim(), rng);
    L.q_norm = rand_norm(s.head_dim, rng);
    L.k_norm = rand_norm(s.head_dim, rng);
    if (s.sparse(l)) {
      L.wiq = rand_mat(s.index_heads * s.index_dim, H, rng);
      L.wik = rand_mat(s.index_dim, H, rng);
      L.iq_norm = rand_norm(s.index_dim, rng);
      L.ik_norm = rand_norm(s.index_dim, rng);
    }
    if (s.moe(l)) {
      L.router = rand_mat(s.num_experts, H, rng);
      L.router_bias = random_vector(size_t(s.num_experts), rng, 0.05f);
      for (int e = 0; e < s.num_experts; ++e) L.experts.push_back(rand_mlp(H, s.moe_inter, rng));
      if (s.shared_inter > 0) L.shared = rand_mlp(H, s.shared_inter, rng);
    } else {
      L.dense = rand_mlp(H, s.dense_inter, rng);
    }
  }
  return w;
}

std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace m3::test
