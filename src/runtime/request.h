// What a client submits to the engine (a prompt of token ids plus sampling and stop rules) and
// what the engine reports back while it runs (new tokens, then one final event).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace m3 {

enum class FinishReason : uint8_t {
  None,       // still running
  Length,     // max_tokens reached, or the model's context is full
  Stop,       // eos (unless ignore_eos) or one of stop_token_ids was generated
  Cancelled,  // cancel(), client gone, or shutdown
  Error,      // the backend failed on a step holding this request
};
const char* finish_reason_name(FinishReason r);  // "length", "stop", "cancelled", "error", "none"

struct GenerationRequest {
  std::vector<int32_t> prompt;          // token ids, non-empty, each in [0, vocab)
  int max_tokens = 16;                  // >= 1
  SamplingParams sampling;              // temperature 0 = greedy
  std::vector<int32_t> stop_token_ids;  // generating one of these ends the request ("stop")
  bool ignore_eos = false;              // when false, the model's eos id is a stop token too
  // -1: none; k in [0, kMaxLogprobs]: every generated token's log-probability and the k most
  // likely alternatives (runtime/sampler.h token_logprob; such a request samples on the host from
  // the step's logits, with the same draws as device sampling)
  int logprobs = -1;
};

// Delivered on the engine thread, in order, for one request: zero or more token events, then
// exactly one event with finished = true. Callbacks must be quick and must not call back into
// the engine's blocking methods (submit/cancel are fine).
struct RequestEvent {
  uint64_t id = 0;
  std::vector<int32_t> new_tokens;  // appended since the previous event (a stop token included)
  bool finished = false;
  FinishReason reason = FinishReason::None;
  int32_t stop_token = -1;          // the eos / stop id that ended the request, else -1
  int prompt_tokens = 0;
  int completion_tokens = 0;        // generated so far (including new_tokens)
  int preemptions = 0;              // times this request was preempted and recomputed
  std::string error;                // for FinishReason::Error / Cancelled: why
  std::vector<TokenLogprob> logprobs;  // one per new token, when the request asked for them
};
using EventCallback = std::function<void(const RequestEvent&)>;

}  // namespace m3
