// `m3mono smoke`: drives a running server from another process and checks every answer. First
// each distinct prompt runs alone (the reference), then each concurrency level in turn sends its
// requests (so the live batch moves e.g. 8 -> 5 -> 4 -> 2 -> 1), checking status, token counts,
// finish reasons, usage, text vs token_ids, stream framing, and that every output equals the
// prompt's reference output (greedy and seeded sampling are both deterministic per request).
// An optional soak (--duration) mixes concurrencies and client disconnects; at the end /metrics
// must show no cache block used and nothing running or queued.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace m3::serve {

struct SmokeOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;                       // "" = the first model /v1/models lists
  std::vector<int> concurrency{8, 5, 4, 2, 1};
  int requests = 16;                       // per concurrency level
  int distinct = 8;                        // distinct prompts (cases)
  int max_tokens = 8;                      // per request: drawn in [max_tokens/2, max_tokens]
  int min_prompt = 1, max_prompt = 24;     // prompt lengths (clamped to the model's context)
  double stream_fraction = 0.5;            // share of streamed requests
  double sampled_fraction = 0.25;          // share of cases using seeded sampling instead of greedy
  double duration_s = 0;                   // > 0: soak for this long after the levels
  double disconnect_fraction = 0.1;        // soak: share of streams the client abandons mid-way
  double timeout_s = 120;                  // per HTTP request
  uint64_t seed = 0;                       // 0 = random (printed)
};

// Runs the smoke test, writing the table and any failures to `out`. Returns 0 when every check
// passed, 1 otherwise (2 when the server cannot be reached or described).
int run_smoke(const SmokeOptions& opt, std::ostream& out);

// Reads one sample value (no labels) from a Prometheus text page; NaN when absent.
double metric_value(const std::string& page, const std::string& name);

}  // namespace m3::serve
