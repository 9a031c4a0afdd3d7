// Drafts and acceptance (runtime/speculative.h).
#include "runtime/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace m3 {

SpeculativeMethod parse_speculative_method(const std::string& s) {
  if (s == "none" || s.empty()) return SpeculativeMethod::None;
  if (s == "ngram") return SpeculativeMethod::Ngram;
  M3_FAIL("speculative method '{}' is not one of: none, ngram", s);
}

const char* speculative_method_name(SpeculativeMethod m) {
  switch (m) {
    case SpeculativeMethod::None: return "none";
    case SpeculativeMethod::Ngram: return "ngram";
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
}

std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int ngram_min, int ngram_max, int max_drafts) {
  const int64_t L = int64_t(tokens.size());
  if (max_drafts <= 0) return {};
  for (int n = std::min<int64_t>(ngram_max, L - 1); n >= ngram_min; --n) {
    const int32_t* suffix = tokens.data() + (L - n);
    // latest start i < L - n whose n tokens equal the suffix
    for (int64_t i = L - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int64_t from = i + n, to = std::min<int64_t>(from + max_drafts, L);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
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
