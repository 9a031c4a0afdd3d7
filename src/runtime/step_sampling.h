// Host side of the backends' optional sampling (SeqStep::sample, StepOutput::tokens):
// validation of the requests, and the exact host implementation (sample_token on the step's own
// logits) that the CPU reference backend uses and that the scheduler falls back to.
#pragma once
#include <cmath>

#include "core/check.h"
#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace m3 {

// Throws m3::Error naming the sequence and field of the first bad request.
inline void validate_sampling_requests(const StepBatch& batch) {
  for (size_t k = 0; k < batch.seqs.size(); ++k) {
    const auto& r = batch.seqs[k].sample;
    if (!r) continue;
    const SamplingParams& p = r->params;
    M3_CHECK(std::isfinite(p.temperature) && p.temperature >= 0,
             "step: seqs[{}].sample.temperature must be finite and >= 0, got {}", k, p.temperature);
    M3_CHECK(p.top_k >= 0, "step: seqs[{}].sample.top_k must be >= 0 (0 = off), got {}", k, p.top_k);
    M3_CHECK(p.top_p > 0 && p.top_p <= 1, "step: seqs[{}].sample.top_p must be in (0, 1], got {}", k, p.top_p);
  }
}

inline bool any_sampling_request(const StepBatch& batch) {
  for (const auto& s : batch.seqs)
    if (s.sample) return true;
  return false;
}

// Fills out.tokens for the requests with sample_token on out's logits (the sequence's last row).
inline void sample_step_on_host(const StepBatch& batch, StepOutput& out) {
  if (!any_sampling_request(batch)) return;
  out.tokens.assign(batch.seqs.size(), -1);
  for (size_t k = 0; k < batch.seqs.size(); ++k) {
    const auto& r = batch.seqs[k].sample;
    if (!r) continue;
    SamplerState st = r->state;
    try {
      out.tokens[k] = sample_token(out.row(int(k), out.num_rows[k] - 1), out.vocab, r->params, st);
    } catch (const std::exception& e) {
      M3_FAIL("step: seqs[{}]: {}", k, e.what());
    }
  }
}

}  // namespace m3
