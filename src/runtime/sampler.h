// Sampling from one row of logits: greedy (temperature 0), temperature, top-k, top-p; seeded and
// reproducible (the same seed and logits give the same token on every machine).
// Order of filters: temperature scales the logits, top-k keeps the k best (ties to the lower id),
// softmax over those, top-p keeps the smallest best-first prefix whose mass reaches top_p (at
// least one token), renormalised; one uniform draw u in [0, 1) picks by cumulative mass in
// best-first order. The draw is a counter-based hash of (seed, draw index), so a request's tokens
// do not depend on other requests or threads.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

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

// Throws m3::Error naming the field when temperature < 0 or not finite, top_k < 0, top_p not in (0, 1].
void validate_sampling(const SamplingParams& p);

// Picks a token; advances st.draws by one unless greedy. NaN logits are an error.
int sample_token(const float* logits, int vocab, const SamplingParams& p, SamplerState& st);

// The lowest id among the largest logits.
int argmax_token(const float* logits, int vocab);

// The distribution sample_token draws from: (id, probability) in best-first order, zero-probability
// entries dropped. Greedy gives the argmax with probability 1. For tests and logprobs.
std::vector<std::pair<int, double>> sampling_distribution(const float* logits, int vocab, const SamplingParams& p);

// A token's log-probability under the model (the log-softmax of the raw logits, in double, before
// temperature and filters, as vLLM reports by default), and the `top` most likely tokens with
// theirs (best first, the lower id first among equals).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprob(const float* logits, int vocab, int32_t token, int top);
constexpr int kMaxLogprobs = 20;  // the most alternatives a request may ask for

// The counter-based generator: splitmix64 finalizer, and a uniform double in [0, 1) for (seed, index).
uint64_t splitmix64(uint64_t x);
double uniform_draw(uint64_t seed, uint64_t index);

}  // namespace m3
