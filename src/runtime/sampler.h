// Sampling from one row of logits: greedy (temperature 0), temperature, top-k, top-p; seeded and
// reproducible (the same seed and logits give the same token on every machine).
#pragma once
#include <cstdint>

namespace m3 {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id wins ties)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

// Deterministic counter-based RNG state per request: draw i of a request uses (seed, i).
struct SamplerState {
  uint64_t seed = 0;
  uint64_t draws = 0;
};

int sample_token(const float* logits, int vocab, const SamplingParams& p, SamplerState& st);

}  // namespace m3
