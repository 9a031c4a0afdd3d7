// The OpenAI-compatible HTTP server over an Engine (cpp-httplib): /v1/completions (JSON or SSE
// streaming; text prompts, decoded text and stop strings when a tokenizer is given), /tokenize and
// /detokenize (vLLM's), /v1/chat/completions (with a chat template), /v1/models, /health, /metrics. Optional bearer-token auth on /v1/*, limits on body
// size, prompt length, max_tokens and concurrent completions, and a graceful shutdown that lets
// live requests finish (or cancels them after a grace period) before the listener closes.
#pragma once
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "serve/metrics.h"
#include "text/template_chat.h"
#include "text/tokenizer.h"

namespace m3::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0 = any free port (bind() returns it)
  std::string api_key;              // empty = no auth
  std::string model_name = "m3";    // the id /v1/models lists and requests must name
  size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int max_prompt_tokens = 0;        // 0 = the engine's max_model_len - 1
  int max_completion_tokens = 0;    // max_tokens limit; 0 = the engine's max_model_len - 1
  int max_concurrent_requests = 64; // completions in flight; more get 429
  int http_threads = 0;             // 0 = max_concurrent_requests + 8
  double stream_keepalive_s = 2.0;  // idle streams send an SSE comment this often (finds gone clients)
  // The checkpoint's tokenizer (its vocab_size must be the model's); null = token-id mode.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  // Its chat template (needs the tokenizer); null = /v1/chat/completions answers 400.
  std::shared_ptr<const text::ChatTemplate> chat_template;
};

class Server {
 public:
  Server(Engine& engine, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws m3::Error when the address is unusable.
  int bind();
  // Serves until stop(); call after bind().
  void serve();
  // Graceful: new completions get 503, live requests get up to `grace_s` to finish, the rest are
  // cancelled (streams end with an error event), then the listener stops and serve() returns.
  void shutdown(double grace_s);
  bool is_running() const;
  ServerCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Constant-time comparison (the time depends only on the lengths), for API keys.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace m3::serve
