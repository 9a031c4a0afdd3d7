// Prometheus text exposition (format 0.0.4) of the engine's and the HTTP server's counters.
// PromText builds one family at a time (HELP and TYPE once, then its samples); render_metrics()
// lays out every m3_* family /metrics serves.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine_stats.h"

namespace m3::serve {

using Labels = std::vector<std::pair<std::string, std::string>>;

class PromText {
 public:
  // type: "gauge", "counter" or "histogram". Samples of a family follow its family() call.
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, double value, const Labels& labels = {});
  // A whole histogram family: cumulative _bucket{labels..., le=...} lines, +Inf, _sum and _count.
  void histogram(const std::string& name, const std::string& help, const Histogram& h, const Labels& labels = {});
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

// Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
std::string escape_label_value(const std::string& v);
// Integers print without a fraction, others with up to 17 significant digits; NaN/Inf as Prometheus spells them.
std::string format_value(double v);

struct ServerCounters {
  int active_requests = 0;                   // completions in flight
  uint64_t rejected_busy = 0;                // 429: over the concurrency limit
  uint64_t client_disconnects = 0;           // streams whose client went away
  std::map<int, uint64_t> responses_by_code;  // every HTTP response, by status
};

// The m3_* families, then vLLM's names for the same numbers (labelled model_name, so dashboards
// built for vLLM read them): vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc (0-1),
// vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:time_to_first_token_seconds,
// vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds.
std::string render_metrics(const EngineStats& e, const ServerCounters& s, const std::string& model_name = "");

}  // namespace m3::serve
