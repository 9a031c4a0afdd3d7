// Speculative decoding in the scheduler: draft tokens proposed for a decoding request, scored in
// one verify step (its last token and the drafts, logits of every token), accepted while they equal
// what the target samples. With greedy sampling the output is exactly that of plain decoding (the
// backends' logits are batch invariant: a verify row's are the bits of one-token steps).
//
// Drafters: n-gram (prompt lookup: the continuation of the latest earlier occurrence of the last n
// tokens, n from max_n down to min_n, as vLLM's `ngram` method; no extra weights), and EAGLE3 (a
// draft model over the target's auxiliary hidden states: runtime/drafter.h, ref/eagle3.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/drafter.h"
#include "runtime/sampler.h"

namespace m3 {

enum class SpeculativeMethod : uint8_t { None, Ngram, Eagle3 };

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::None;
  int num_draft_tokens = 3;  // k: drafts per verify step (1 .. 3: a verify row has at most 4 tokens)
  int ngram_min = 1;         // n-gram lengths tried, longest first
  int ngram_max = 4;
  // Eagle3: the drafter (its model and per-sequence caches); one owner of the requests it serves.
  std::shared_ptr<Drafter> drafter;
};

constexpr int kMaxDraftTokens = 3;

// "none" / "ngram" / "eagle3" -> the method; errors name the value and the choices.
SpeculativeMethod parse_speculative_method(const std::string& s);
const char* speculative_method_name(SpeculativeMethod m);
// Throws m3::Error naming the bad field (eagle3 without a drafter included).
void validate_speculative(const SpeculativeOptions& o);

// Up to max_drafts tokens continuing `tokens` (prompt + generated): for n = ngram_max down to
// ngram_min, the tokens after the latest earlier occurrence of the last n tokens (the suffix itself
// excluded); empty when none matches.
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_drafts);

// What greedy verification keeps: given the drafts d_0 .. d_{m-1} and the target's tokens t_0 ..
// t_m (t_i sampled from the logits after d_{i-1}, t_0 after the last accepted token), the tokens
// t_0 .. t_j where j is the first index with t_j != d_j (or m). j drafts were accepted.
std::vector<int32_t> accept_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target);

// What a verify step yields for one request: `rows` holds drafts.size() + 1 logits rows (after the
// last accepted token, then after each draft). Greedy (temperature 0): t_i = argmax of row i, kept
// while t_i equals draft i (accept_greedy): exactly the tokens of plain decoding. Sampling: the
// standard acceptance for a deterministic proposal: draft i is kept with probability p_i(draft)
// (one draw), else the token comes from p_i without the draft, renormalised (a second draw), and
// the step ends; after every draft is kept one more token is sampled from the last row. The
// tokens' distribution is the target's (p_i as sample_token draws from it: temperature, top-k,
// top-p). Draws come from st (the request's counter), so runs repeat.
struct VerifyResult {
  std::vector<int32_t> tokens;  // to append: the kept drafts, then the token that ends the step
  int accepted = 0;             // drafts kept
};
VerifyResult verify_drafts(const float* rows, int vocab, std::span<const int32_t> drafts, const SamplingParams& p,
                           SamplerState& st);

}  // namespace m3
