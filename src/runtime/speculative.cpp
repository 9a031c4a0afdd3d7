// Drafts and acceptance (runtime/speculative.h).
#include "runtime/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace m3 {

SpeculativeMethod parse_speculative_method(const std::string& s) {
  if (s == "none" || s.empty()) return SpeculativeMethod::None;
  if (s == "ngram") return SpeculativeMethod::Ngram;
  if (s == "eagle3") return SpeculativeMethod::Eagle3;
  M3_FAIL("speculative method '{}' is not one of: none, ngram, eagle3", s);
}

const char* speculative_method_name(SpeculativeMethod m) {
  switch (m) {
    case SpeculativeMethod::None: return "none";
    case SpeculativeMethod::Ngram: return "ngram";
    case SpeculativeMethod::Eagle3: return "eagle3";
  }
  return "?";
}

void validate_speculative(const SpeculativeOptions& o) {
  M3_CHECK(o.num_draft_tokens >= 1 && o.num_draft_tokens <= kMaxDraftTokens,
           "speculative: num_draft_tokens {} outside [1, {}] (a verify row holds at most {} tokens)",
           o.num_draft_tokens, kMaxDraftTokens, kMaxDraftTokens + 1);
  M3_CHECK(o.ngram_min >= 1 && o.ngram_max >= o.ngram_min,
           "speculative: n-gram lengths [{}, {}] (need 1 <= ngram_min <= ngram_max)", o.ngram_min, o.ngram_max);
  M3_CHECK(o.ngram_max <= 64, "speculative: ngram_max {} above 64", o.ngram_max);
  M3_CHECK(o.method != SpeculativeMethod::Eagle3 || o.drafter,
           "speculative: eagle3 needs a draft model (--draft-model DIR: an EAGLE3 checkpoint)");
}

// One pass from the end: for every earlier end position e (<= L - 2), m(e) = how many tokens
// ending at e equal the sequence's last ones (at most ngram_max); the longest n >= ngram_min that
// any e reaches wins, at its latest e (the first one the backward scan meets at that length), so
// the result is the n-from-longest, latest-occurrence rule in O(L) (a 200K-token request: ~0.2 ms
// a step instead of one scan per n).
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_drafts) {
  const int64_t L = int64_t(tokens.size());
  if (max_drafts <= 0 || L < 2) return {};
  const int64_t cap = std::min<int64_t>(ngram_max, L - 1);
  if (cap < ngram_min) return {};
  const int32_t* t = tokens.data();
  const int32_t last = t[L - 1];
  int64_t best_n = 0, best_e = -1;
  for (int64_t e = L - 2; e >= 0; --e) {
    if (t[e] != last) continue;
    const int64_t most = std::min<int64_t>(cap, e + 1);
    if (most <= best_n) continue;  // cannot beat what a later end already matched
    int64_t m = 1;
    while (m < most && t[e - m] == t[L - 1 - m]) ++m;
    if (m > best_n && m >= ngram_min) {
      best_n = m;
      best_e = e;
      if (m == cap) break;  // the longest possible, at the latest end
    }
  }
  if (best_e < 0) return {};
  const int64_t from = best_e + 1, to = std::min<int64_t>(from + max_drafts, L);
  return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
}

std::vector<int32_t> accept_greedy(std::span<const int32_t> drafts, std::span<const int32_t> target) {
  M3_CHECK(target.size() == drafts.size() + 1, "speculative: {} target tokens for {} drafts (need drafts + 1)",
           target.size(), drafts.size());
  std::vector<int32_t> out;
  for (size_t i = 0; i < target.size(); ++i) {
    out.push_back(target[i]);
    if (i == drafts.size() || target[i] != drafts[i]) break;
  }
  return out;
}

VerifyResult verify_drafts(const float* rows, int vocab, std::span<const int32_t> drafts, const SamplingParams& p,
                           SamplerState& st) {
  VerifyResult r;
  const size_t V = size_t(vocab);
  if (p.temperature == 0) {
    std::vector<int32_t> target;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      target.push_back(int32_t(argmax_token(rows + i * V, vocab)));
      if (i < drafts.size() && target.back() != drafts[i]) break;  // later rows are not needed
    }
    while (target.size() < drafts.size() + 1) target.push_back(-1);  // (never read: accept_greedy stops before)
    r.tokens = accept_greedy(drafts, target);
    r.accepted = int(r.tokens.size()) - 1;
    return r;
  }
  validate_sampling(p);
  for (size_t i = 0; i < drafts.size(); ++i) {
    const auto dist = sampling_distribution(rows + i * V, vocab, p);
    double pd = 0;
    for (const auto& [id, prob] : dist)
      if (id == drafts[i]) pd = prob;
    const double u = uniform_draw(st.seed, st.draws++);
    if (u < pd) {  // kept
      r.tokens.push_back(drafts[i]);
      ++r.accepted;
      continue;
    }
    // rejected: the residual max(p - q, 0) with q one-hot on the draft is p without it
    const double rest = 1.0 - pd;
    const double u2 = uniform_draw(st.seed, st.draws++) * rest;
    double cum = 0;
    int32_t tok = -1;
    for (const auto& [id, prob] : dist) {
      if (id == drafts[i]) continue;
      tok = id;
      cum += prob;
      if (u2 < cum) break;
    }
    if (tok < 0) tok = drafts[i];  // (rounding: the draft held all the mass)
    r.tokens.push_back(tok);
    return r;
  }
  r.tokens.push_back(int32_t(sample_token(rows + drafts.size() * V, vocab, p, st)));
  return r;
}

}  // namespace m3
