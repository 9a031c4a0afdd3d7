// Counters and gauges the engine keeps while it runs, copied out as one snapshot (the server's
// /metrics renders it). Updated once per step on the engine thread, read from any thread.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace m3 {

// Cumulative-friendly histogram: counts[i] = observations <= bounds[i]; counts.back() = the rest.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1 (per bucket, not cumulative)
  double sum = 0;
  uint64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    counts[i]++;
    sum += v;
    count++;
  }
};

struct EngineStats {
  std::string backend;            // the native backend's name ("cpu-ref", ...)
  int waiting = 0;                // queued requests (not yet admitted, or preempted)
  int running = 0;                // admitted requests
  int cache_blocks_total = 0;
  int cache_blocks_used = 0;
  int cache_block_size = 0;
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;       // prefill tokens computed (recompute included)
  uint64_t generation_tokens = 0;   // tokens sampled
  uint64_t preemptions = 0;
  uint64_t spec_verify_rows = 0;      // speculative decoding: request rows that verified drafts
  uint64_t spec_draft_tokens = 0;     // drafts scored
  uint64_t spec_accepted_tokens = 0;  // drafts kept
  uint64_t step_errors = 0;
  uint64_t requests_submitted = 0;
  std::map<std::string, uint64_t> requests_finished;  // by finish reason name
  double tokens_per_second = 0;     // generated tokens per second over the last few seconds
  Histogram step_latency;           // seconds per backend step
  Histogram batch_size;             // sequences per step
  // per request (seconds): submission to its first token, between consecutive tokens (an event of
  // k tokens counts k intervals of a k-th of its gap each), submission to its end
  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram e2e_latency;
  std::map<std::string, uint64_t> steps_by_path;
  std::map<std::pair<std::string, std::string>, uint64_t> fallbacks;  // (path taken, reason) -> steps
};

}  // namespace m3
