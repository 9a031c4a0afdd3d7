// `m3mono serve --model DIR`: loads the checkpoint into the chosen backend (--device, as in
// generate: the CUDA native backend or the CPU reference), starts the
// engine and the OpenAI-compatible HTTP server, and shuts down gracefully on SIGTERM / SIGINT
// (live requests get --shutdown-grace seconds to finish, then are cancelled; exit code 0).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/tp_args.h"
#include "cli/backend_choice.h"
#include "cli/command.h"
#include "cli/speculative_args.h"
#include "core/check.h"
#include "model/spec.h"
#include "runtime/engine.h"
#include "serve/server.h"
#include "text/template_chat.h"
#include "text/tokenizer.h"

namespace m3::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::string name;
  serve::ServerOptions server;
  int cache_blocks = 256;
  int threads = 0;
  int tp = 1;
  std::string tp_comm = "auto";
  std::string tp_launch = "threads";
  std::string device = "auto", weights = "checkpoint", router_dtype = "float32";
  int max_num_seqs = 16;
  int max_step_tokens = 512;
  SpeculativeArgs spec;
  int max_model_len = 0;
  double grace_s = 10;
  bool device_sampling = true;
  bool mono = false;
};

// Signals: SIGTERM/SIGINT are blocked in every thread (the mask is set before any thread exists,
// so all inherit it) and taken by one thread in sigwait(). Before the server is up a signal exits
// at once; the first one after starts a graceful shutdown; a second one exits immediately.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { loop(); });
  }
  ~SignalWatcher() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait; done_ makes it return
    thread_.join();
  }
  void serving() {
    std::lock_guard lk(mu_);
    serving_ = true;
  }
  // Blocks until a signal arrives or wake() is called; returns the signal (0 for wake()).
  int wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return signal_ != 0 || woken_; });
    return signal_;
  }
  void wake() {
    std::lock_guard lk(mu_);
    woken_ = true;
    cv_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      int sig = 0;
      sigwait(&set_, &sig);
      std::lock_guard lk(mu_);
      if (done_) return;
      const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      if (!serving_) {
        std::fprintf(stderr, "m3mono serve: %s while loading, exiting\n", name);
        std::_Exit(128 + sig);
      }
      if (signal_ != 0) {
        std::fprintf(stderr, "m3mono serve: second %s, exiting now\n", name);
        std::_Exit(128 + sig);
      }
      signal_ = sig;
      cv_.notify_all();
    }
  }
  sigset_t set_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false, done_ = false, woken_ = false;
  int signal_ = 0;
  std::thread thread_;
};

int run_serve(ServeArgs a) {
  signal(SIGPIPE, SIG_IGN);  // a write to a socket whose client left must fail, not kill us
  SignalWatcher signals;

  if (a.server.api_key.empty())
    if (const char* k = std::getenv("M3_API_KEY")) a.server.api_key = k;
  std::filesystem::path dir(a.model);
  M3_CHECK(std::filesystem::is_directory(dir), "serve: --model {} is not a directory", a.model);
  a.server.model_name = !a.name.empty() ? a.name : std::filesystem::weakly_canonical(dir).filename().string();

  BackendChoice choice{a.device, a.weights, a.threads, a.cache_blocks, a.max_model_len};
  choice.router_dtype = a.router_dtype;
  choice.mono = a.mono;
  choice.tp = a.tp;
  choice.tp_comm = a.tp_comm;
  choice.tp_launch = a.tp_launch;
  validate_backend_choice(choice, "serve");
  std::fprintf(stderr, "m3mono serve: loading %s\n", a.model.c_str());
  ModelSpec spec = load_model_spec(dir);
  // The tokenizer first: a broken tokenizer.json fails before the (slow) weight load.
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    try {
      a.server.tokenizer = std::make_shared<const text::Tokenizer>(text::Tokenizer::load(dir.string(), spec.vocab_size));
    } catch (const std::exception& e) {
      M3_FAIL("serve: cannot load the tokenizer: {}", e.what());
    }
    // and the chat template, where the directory has one (a broken one is an error too)
    const bool has_template = std::filesystem::exists(dir / "chat_template.jinja") ||
                              std::filesystem::exists(dir / "chat_template.json") ||
                              std::filesystem::exists(dir / "tokenizer_config.json");
    if (has_template) {
      try {
        a.server.chat_template =
            std::make_shared<const text::ChatTemplate>(text::ChatTemplate::compile(text::load_chat_template_source(dir)));
      } catch (const std::exception& e) {
        M3_FAIL("serve: cannot load the chat template of {}: {}", a.model, e.what());
      }
    }
  }
  auto backend = make_chosen_backend(choice, a.model, spec, "serve");
  EngineOptions eo;
  eo.scheduler.max_num_seqs = a.max_num_seqs;
  eo.scheduler.max_step_tokens = a.max_step_tokens;
  eo.scheduler.max_model_len = a.max_model_len;
  eo.scheduler.device_sampling = a.device_sampling;
  eo.scheduler.speculative = speculative_options(a.spec, "serve", a.model, spec,
                                                      choice.device == "cuda" || (choice.device == "auto" && cuda_usable()));
  Engine engine(std::move(backend), eo);
  serve::Server server(engine, a.server);
  int port = server.bind();
  std::fprintf(stderr,
               "m3mono serve: model '%s' (vocab %d, context %d, %d cache blocks of %d tokens, backend %s)\n"
               "m3mono serve: %s\n"
               "m3mono serve: listening on http://%s:%d%s\n",
               a.server.model_name.c_str(), spec.vocab_size, engine.max_model_len(), a.cache_blocks,
               spec.index_block, engine.stats().backend.c_str(),
               a.server.chat_template ? "tokenizer.json and chat template loaded: text prompts, /v1/chat/completions, "
                                        "/tokenize, /detokenize"
               : a.server.tokenizer   ? "tokenizer.json loaded (no chat template): text prompts, /tokenize, /detokenize"
                                      : "no tokenizer.json: token-id prompts only",
               a.server.host.c_str(), port,
               a.server.api_key.empty() ? "" : " (API key required)");

  std::thread http([&] {
    server.serve();
    signals.wake();  // returns early only if the listener failed
  });
  signals.serving();
  int sig = signals.wait();
  if (sig == 0) std::fprintf(stderr, "m3mono serve: the listener stopped unexpectedly, shutting down\n");
  else
    std::fprintf(stderr, "m3mono serve: %s received, finishing live requests (up to %.0f s; again to exit now)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", a.grace_s);
  server.shutdown(a.grace_s);
  http.join();
  auto st = engine.stats();
  std::fprintf(stderr, "m3mono serve: stopped cleanly (%llu steps, %llu tokens generated, %d cache blocks used)\n",
               (unsigned long long)st.steps, (unsigned long long)st.generation_tokens, st.cache_blocks_used);
  return sig == 0 ? 1 : 0;
}

M3_COMMAND(
    "serve", "Serve a checkpoint over an OpenAI-compatible HTTP API (/v1/completions, /v1/models, /health, /metrics)",
    [](CLI::App& app) -> RunFn {
      auto a = std::make_shared<ServeArgs>();
      app.add_option("--model", a->model, "Checkpoint directory (config.json + *.safetensors)")->required();
      app.add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
      app.add_option("--port", a->server.port, "Port (0 = any free port, printed at start)")->capture_default_str();
      app.add_option("--api-key", a->server.api_key,
                     "Require 'Authorization: Bearer KEY' on /v1/* (default: $M3_API_KEY if set)");
      app.add_option("--served-model-name", a->name, "Model id clients name (default: the directory's name)");
      app.add_option("--cache-blocks", a->cache_blocks, "Paged-cache blocks (of index_block_size tokens)")
          ->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--device", a->device, "cpu, cuda or auto (auto: CUDA when available, else the CPU reference)")
          ->capture_default_str();
      app.add_option("--weights", a->weights, "CPU reference only: checkpoint (fp32) or prepared (the GPU's numbers)")
          ->capture_default_str();
      app.add_option("--router-dtype", a->router_dtype, "prepared router weight: float32 or bfloat16 (logits, sigmoid and bias stay fp32)")
          ->capture_default_str();
      app.add_option("--threads", a->threads, "CPU backend threads (0 = all cores)")->capture_default_str();
      add_tp_options(app, a->tp, a->tp_comm, a->tp_launch);
      app.add_flag("--mono", a->mono,
                   "CUDA: the fused persistent decode path for the steps it serves (decode and verify steps, <= 4 "
                   "rows of <= 4 tokens); /metrics counts steps per path and fallbacks by reason");
      add_speculative_options(app, a->spec);
      app.add_flag("--device-sampling,!--host-sampling", a->device_sampling,
                   "sample on the backend (the GPU kernel on CUDA; default) or copy logits back and sample on the host");
      app.add_option("--max-num-seqs", a->max_num_seqs, "Largest running batch")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--max-step-tokens", a->max_step_tokens, "Token budget of one step (chunked prefill)")
          ->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--max-model-len", a->max_model_len, "Prompt + completion limit (0 = what model and cache allow)")
          ->capture_default_str();
      app.add_option("--max-body-bytes", a->server.max_body_bytes, "Largest request body")->capture_default_str();
      app.add_option("--max-prompt-tokens", a->server.max_prompt_tokens, "Longest prompt (0 = context - 1)")
          ->capture_default_str();
      app.add_option("--max-tokens-limit", a->server.max_completion_tokens, "Largest max_tokens (0 = context - 1)")
          ->capture_default_str();
      app.add_option("--max-concurrent-requests", a->server.max_concurrent_requests,
                     "Completions in flight; more get 429")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--shutdown-grace", a->grace_s, "Seconds live requests get to finish on SIGTERM/SIGINT")
          ->capture_default_str();
      return [a] { return run_serve(*a); };
    },
    30);

}  // namespace
}  // namespace m3::cli
