// Random inputs shared by the tests: a fresh seed per test (printed on failure, overridable with
// M3_TEST_SEED to replay), random vectors, small random model specs and weights with sane scales
// (activations stay O(1) through any number of layers, so comparisons are meaningful).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "model/spec.h"
#include "model/weights.h"

namespace m3::test {

// std::random_device, or the value of the environment variable M3_TEST_SEED when set.
uint64_t fresh_seed();

void fill_normal(std::span<float> x, std::mt19937_64& rng, float stddev, float mean = 0.0f);
std::vector<float> random_vector(size_t n, std::mt19937_64& rng, float stddev = 1.0f);

// A fixed small MiniMax-M3-shaped spec: 3 layers (full+dense, sparse+MoE, sparse+MoE), hidden 48,
// 4 query heads over 2 KV groups of head_dim 16 (rotary 8), 6 experts top-2 plus a shared one,
// vocab 101, index 2 x 16, block 4, top-3 blocks, 1 local block, max_positions 1024.
ModelSpec small_spec();

// Random small shapes: 2-4 layers with random attention/MLP kinds (at least one sparse), 1-3 KV
// groups of 1-3 heads, head_dim 8 or 16, rotary_dim in {0, 2, .., head_dim} (even), block 2-8,
// top-k 1-4, local 1-2, 3-8 experts, shared expert present or not.
ModelSpec random_spec(std::mt19937_64& rng);

// Weights for spec: linear layers N(0, 1/in) so each output has about unit variance, norm weights
// N(0, 0.2^2) (the (1+w) factor stays near 1), embeddings N(0, 1), router bias N(0, 0.05^2).
ModelWeights make_random_weights(const ModelSpec& spec, uint64_t seed);

// n random token ids in [0, vocab).
std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937_64& rng);

}  // namespace m3::test
