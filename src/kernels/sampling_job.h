// One row's sampling request as the device sampler reads it (plain struct: host code fills it,
// kernels/sampling.cuh reads it). Same meaning as runtime/sampler.h's SamplingParams plus the
// counter of the draw: temperature 0 = greedy; top_k 0 = off; top_p 1 = off; the uniform draw is
// rng::uniform_draw(seed, draw) (core/counter_rng.h).
#pragma once
#include <cstdint>

namespace m3::kernels {

struct SampleJob {
  int64_t row = 0;            // logits row (of the launch's [*][ld] logits)
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t pad = 0;
  uint64_t seed = 0;
  uint64_t draw = 0;          // draw index (SamplerState::draws before the draw)
};

// Per-row status the kernels write next to the token (the launcher's caller makes it an error).
constexpr int32_t kSampleOk = 0;
constexpr int32_t kSampleAllNegInf = -1;  // stochastic row whose every logit is -inf
// status > 0: 1 + the lowest token id whose logit is NaN (token is -1)

}  // namespace m3::kernels
