// One prompt through a backend, step by step (the `generate` command and the Python module's
// LLM.generate): the prompt as one prefill step, then one decode step per new token (or, with
// speculative decoding, a verify step of the last token and its drafts that yields 1 .. k + 1), each token
// sampled with SamplingParams and a SamplerState of (seed, draw index) — on the backend when
// device_sampling (SeqStep::sample, no logits copied back), else here with sample_token on the
// step's logits: the same tokens either way. The sequence uses cache blocks 0, 1, ... of the
// backend (it overwrites what another sequence left there).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace m3 {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids, at least one
  int max_tokens = 16;          // new tokens, >= 1
  SamplingParams sampling;
  uint64_t seed = 0;
  int stop_id = -1;             // stop after this id (e.g. the model's eos; -1: never)
  bool device_sampling = true;
  // Speculative decoding (runtime/speculative.h): a decode step with drafts becomes a verify step
  // of the last token and the drafts (logits back, tokens chosen by verify_drafts).
  SpeculativeOptions speculative{};
};

struct GenerateResult {
  std::vector<int32_t> ids;                 // the new tokens
  std::map<std::string, int> paths;         // steps per execution path ("native", "mono", ...)
  std::map<std::string, int> fallbacks;     // steps a preferred path declined, by reason
  double prefill_s = 0, decode_s = 0;
  int verify_steps = 0, drafted = 0, accepted = 0;  // speculative decoding
};

// Cache positions a request needs (the last new token is never fed back).
int64_t generate_positions(const GenerateRequest& r);

// Throws (naming the field) on an empty prompt, an id outside the vocabulary, max_tokens < 1, bad
// sampling parameters, or more positions than the backend's cache holds.
GenerateResult generate(Backend& b, const GenerateRequest& r);

}  // namespace m3
