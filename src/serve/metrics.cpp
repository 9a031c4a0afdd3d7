// Prometheus text format writer and the /metrics layout.
#include "serve/metrics.h"

#include <cmath>
#include <fmt/format.h>

namespace m3::serve {

std::string escape_label_value(const std::string& v) {
  std::string o;
  o.reserve(v.size());
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

static std::string escape_help(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{}", v);  // shortest form that reads back exactly
}

void PromText::family(const std::string& name, const std::string& type, const std::string& help) {
  out_ += "# HELP " + name + " " + escape_help(help) + "\n";
  out_ += "# TYPE " + name + " " + type + "\n";
}

void PromText::sample(const std::string& name, double value, const Labels& labels) {
  out_ += name;
  if (!labels.empty()) {
    out_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ",";
      out_ += labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
    }
    out_ += "}";
  }
  out_ += " " + format_value(value) + "\n";
}

void PromText::histogram(const std::string& name, const std::string& help, const Histogram& h, const Labels& labels) {
  family(name, "histogram", help);
  auto with_le = [&](const std::string& le) {
    Labels l = labels;
    l.emplace_back("le", le);
    return l;
  };
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += i < h.counts.size() ? h.counts[i] : 0;
    sample(name + "_bucket", double(cum), with_le(format_value(h.bounds[i])));
  }
  sample(name + "_bucket", double(h.count), with_le("+Inf"));
  sample(name + "_sum", h.sum, labels);
  sample(name + "_count", double(h.count), labels);
}

std::string render_metrics(const EngineStats& e, const ServerCounters& s, const std::string& model_name) {
  PromText p;
  p.family("m3_backend_info", "gauge", "The native backend serving this model (value is always 1).");
  p.sample("m3_backend_info", 1, {{"backend", e.backend}});
  p.family("m3_queue_depth", "gauge", "Requests waiting to be admitted (new or preempted).");
  p.sample("m3_queue_depth", e.waiting);
  p.family("m3_requests_running", "gauge", "Requests admitted to the running batch.");
  p.sample("m3_requests_running", e.running);
  p.family("m3_http_requests_active", "gauge", "Completion HTTP requests in flight.");
  p.sample("m3_http_requests_active", s.active_requests);
  p.family("m3_cache_blocks_used", "gauge", "Paged-cache blocks held by requests.");
  p.sample("m3_cache_blocks_used", e.cache_blocks_used);
  p.family("m3_cache_blocks_free", "gauge", "Paged-cache blocks free.");
  p.sample("m3_cache_blocks_free", e.cache_blocks_total - e.cache_blocks_used);
  p.family("m3_cache_block_tokens", "gauge", "Tokens per paged-cache block.");
  p.sample("m3_cache_block_tokens", e.cache_block_size);
  p.family("m3_generation_tokens_per_second", "gauge", "Tokens generated per second over the last few seconds.");
  p.sample("m3_generation_tokens_per_second", e.tokens_per_second);
  p.family("m3_generation_tokens_total", "counter", "Tokens sampled.");
  p.sample("m3_generation_tokens_total", double(e.generation_tokens));
  p.family("m3_prompt_tokens_total", "counter", "Prefill tokens computed (recompute after preemption included).");
  p.sample("m3_prompt_tokens_total", double(e.prompt_tokens));
  p.family("m3_steps_total", "counter", "Engine steps, by the execution path that ran them.");
  if (e.steps_by_path.empty()) p.sample("m3_steps_total", 0, {{"path", "native"}});
  for (const auto& [path, n] : e.steps_by_path) p.sample("m3_steps_total", double(n), {{"path", path}});
  p.family("m3_step_fallbacks_total", "counter",
           "Steps a preferred path declined, by the path that ran them and the refusal reason.");
  for (const auto& [key, n] : e.fallbacks)
    p.sample("m3_step_fallbacks_total", double(n), {{"path", key.first}, {"reason", key.second}});
  p.histogram("m3_step_latency_seconds", "Wall time of one backend step.", e.step_latency);
  p.histogram("m3_step_batch_size", "Sequences per step.", e.batch_size);
  p.family("m3_preemptions_total", "counter", "Requests preempted (cache blocks freed, recomputed later).");
  p.sample("m3_preemptions_total", double(e.preemptions));
  p.family("m3_spec_verify_rows_total", "counter", "Speculative decoding: request rows that verified drafts.");
  p.sample("m3_spec_verify_rows_total", double(e.spec_verify_rows));
  p.family("m3_spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens scored.");
  p.sample("m3_spec_draft_tokens_total", double(e.spec_draft_tokens));
  p.family("m3_spec_accepted_tokens_total", "counter",
           "Speculative decoding: draft tokens kept (acceptance length = 1 + accepted / verify rows).");
  p.sample("m3_spec_accepted_tokens_total", double(e.spec_accepted_tokens));
  p.family("m3_step_errors_total", "counter", "Steps whose backend call failed (their requests got errors).");
  p.sample("m3_step_errors_total", double(e.step_errors));
  p.family("m3_requests_submitted_total", "counter", "Requests accepted by the engine.");
  p.sample("m3_requests_submitted_total", double(e.requests_submitted));
  p.family("m3_requests_finished_total", "counter", "Requests finished, by finish reason.");
  for (const char* r : {"length", "stop", "cancelled", "error"}) {
    auto it = e.requests_finished.find(r);
    p.sample("m3_requests_finished_total", it == e.requests_finished.end() ? 0 : double(it->second),
             {{"reason", r}});
  }
  p.family("m3_http_rejected_busy_total", "counter", "Completions refused with 429 (concurrency limit).");
  p.sample("m3_http_rejected_busy_total", double(s.rejected_busy));
  p.family("m3_http_client_disconnects_total", "counter", "Streams cancelled because the client went away.");
  p.sample("m3_http_client_disconnects_total", double(s.client_disconnects));
  p.family("m3_http_responses_total", "counter", "HTTP responses, by status code.");
  for (const auto& [code, n] : s.responses_by_code) p.sample("m3_http_responses_total", double(n), {{"code", std::to_string(code)}});
  // vLLM's names
  const Labels model{{"model_name", model_name}};
  p.family("vllm:num_requests_running", "gauge", "Requests in the running batch (vLLM's name).");
  p.sample("vllm:num_requests_running", e.running, model);
  p.family("vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted (vLLM's name).");
  p.sample("vllm:num_requests_waiting", e.waiting, model);
  p.family("vllm:kv_cache_usage_perc", "gauge", "Fraction of paged-cache blocks in use, 0 to 1 (vLLM's name).");
  p.sample("vllm:kv_cache_usage_perc",
           e.cache_blocks_total > 0 ? double(e.cache_blocks_used) / double(e.cache_blocks_total) : 0.0, model);
  p.family("vllm:prompt_tokens_total", "counter", "Prefill tokens computed (vLLM's name).");
  p.sample("vllm:prompt_tokens_total", double(e.prompt_tokens), model);
  p.family("vllm:generation_tokens_total", "counter", "Tokens generated (vLLM's name).");
  p.sample("vllm:generation_tokens_total", double(e.generation_tokens), model);
  p.histogram("vllm:time_to_first_token_seconds", "Submission to first token, per request (vLLM's name).",
              e.time_to_first_token, model);
  p.histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request (vLLM's name).",
              e.inter_token_latency, model);
  p.histogram("vllm:e2e_request_latency_seconds", "Submission to end, per request (vLLM's name).", e.e2e_latency,
              model);
  return p.str();
}

}  // namespace m3::serve
