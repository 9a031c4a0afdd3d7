// Server: httplib routes, per-request jobs fed by engine callbacks, SSE streaming, shutdown.
#include "serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fmt/format.h>
#include <mutex>
#include <optional>
#include <span>
#include <random>
#include <thread>

#include "core/check.h"
#include "serve/chat_api.h"
#include "serve/completion_api.h"
#include "serve/reasoning.h"
#include "serve/text_stream.h"
#include "serve/tokenize_api.h"
#include "text/tokenizer.h"

namespace m3::serve {

bool constant_time_equal(const std::string& a, const std::string& b) {
  // NOTE: every byte of the longer string is visited whatever the contents, so the time leaks
  // only the lengths.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One HTTP completion: its prompts' engine requests and what they produced so far. With a
// tokenizer every choice decodes its tokens as they come (TextStream) and may end early on a stop
// string; the engine request is then cancelled and whatever it still reports is ignored.
struct Job {
  struct Choice {
    uint64_t engine_id = 0;
    std::vector<int32_t> tokens;
    std::string text;
    bool finished = false;
    FinishReason reason = FinishReason::None;
    int32_t stop_token = -1;
    std::string stop_string;
    int prompt_tokens = 0;
    std::string error;
    std::unique_ptr<TextStream> text_stream;  // null: token-id mode
    std::unique_ptr<ReasoningSplit> reasoning;  // chat text: the thinking split off the answer
    std::string reasoning_text;
    std::unique_ptr<ToolCallParser> tools;  // chat text with tools: calls out of the answer
    std::vector<ToolCall> calls;
    std::optional<std::vector<LogprobText>> logprobs;  // asked for: one per token
    // "tool_calls" when the model ended its turn (stop) after calling tools
    std::string finish_name() const {
      return reason == FinishReason::Stop && !calls.empty() ? "tool_calls" : finish_reason_name(reason);
    }
  };
  uint64_t call_ids = 0;  // tool-call id stream (seeded by the server)
  int n = 1;              // choices per prompt (a prompt's tokens count once in the usage)
  const text::Tokenizer* tokenizer = nullptr;  // for logprobs' token texts

  std::string token_text(int32_t id) const {
    if (!tokenizer) return fmt::format("token_id:{}", id);
    const int32_t one[1] = {id};
    return tokenizer->decode(std::span<const int32_t>(one, 1), false);
  }
  LogprobText logprob_text(const TokenLogprob& l) const {
    LogprobText t{token_text(l.token), l.logprob, {}};
    for (const auto& [id, lp] : l.top) t.top.emplace_back(token_text(id), lp);
    return t;
  }
  struct Event {
    ChoiceResult result;  // the new tokens (and text) of one choice
    FinishReason reason = FinishReason::None;
    std::string error;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Choice> choices;
  std::deque<Event> events;  // streaming: not yet written
  int unfinished = 0;
  bool stream = false;

  // Returns true when a stop string ended the choice while the engine is still generating for it
  // (the caller cancels the engine request).
  bool on_event(int i, const RequestEvent& ev) {
    std::lock_guard lk(mu);
    Choice& c = choices[size_t(i)];
    if (c.finished) return false;  // after a stop string: the engine's leftovers and its cancellation
    c.prompt_tokens = ev.prompt_tokens;
    ChoiceResult out;
    out.index = i;
    std::string delta;
    bool stopped = false;
    if (c.logprobs) out.logprobs.emplace();
    for (size_t ti = 0; ti < ev.new_tokens.size(); ++ti) {
      const int32_t t = ev.new_tokens[ti];
      c.tokens.push_back(t);
      out.tokens.push_back(t);
      if (c.logprobs && ti < ev.logprobs.size()) {
        c.logprobs->push_back(logprob_text(ev.logprobs[ti]));
        out.logprobs->push_back(c.logprobs->back());
      }
      if (c.text_stream) {
        delta += c.text_stream->push(t);
        if (c.text_stream->stopped()) {
          stopped = true;
          break;
        }
      }
    }
    if (stopped) {
      c.finished = true;
      c.reason = FinishReason::Stop;
      c.stop_string = c.text_stream->matched_stop();
      unfinished--;
    } else if (ev.finished) {
      if (c.text_stream && ev.reason != FinishReason::Error && ev.reason != FinishReason::Cancelled)
        delta += c.text_stream->finish();
      c.finished = true;
      c.reason = ev.reason;
      c.stop_token = ev.stop_token;
      c.error = ev.error;
      unfinished--;
    }
    if (c.reasoning) {
      ReasoningSplit::Out r = c.reasoning->push(delta, c.finished);
      c.reasoning_text += r.reasoning;
      out.reasoning = std::move(r.reasoning);
      delta = std::move(r.content);
    }
    if (c.tools) {
      ToolCallParser::Out t = c.tools->push(delta, c.finished);
      out.tool_call_index = int(c.calls.size());
      for (auto& k : t.calls) {
        call_ids = call_ids * 6364136223846793005ull + 1442695040888963407ull;
        k.id = fmt::format("call_{:016x}", call_ids);
        c.calls.push_back(k);
        out.tool_calls.push_back(std::move(k));
      }
      delta = std::move(t.content);
    }
    if (c.text_stream) {
      c.text += delta;
      out.text = std::move(delta);
    }
    if (c.finished) {
      out.finish_reason = c.finish_name();
      out.stop_token = c.stop_token;
      out.stop_string = c.stop_string;
    }
    if (stream) events.push_back(Event{std::move(out), c.finished ? c.reason : FinishReason::None, c.error});
    cv.notify_all();
    return stopped && !ev.finished;
  }
  Usage usage() const {  // call with mu held (or after all finished)
    Usage u;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (i % size_t(n) == 0) u.prompt_tokens += choices[i].prompt_tokens;
      u.completion_tokens += int(choices[i].tokens.size());
    }
    return u;
  }
};

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerOptions opt;
  ApiLimits limits;
  httplib::Server http;
  std::atomic<bool> draining{false};
  std::atomic<int> active{0};
  std::atomic<uint64_t> next_cmpl{1};
  mutable std::mutex mu;  // counters, rng
  ServerCounters counters;
  std::mt19937_64 rng{std::random_device{}()};
  std::condition_variable idle_cv;
  int listen_fd = -1;  // the listening socket (set_socket_options sees it before bind)

  // cpp-httplib listens with a backlog of 5 (compiled into the shared library). A burst of new
  // connections larger than that overflows the accept queue (the kernel drops the handshake's last
  // ACK; a client that already sent its request waits on retransmits or sees a reset). Measured on
  // 2026-11-30: /proc/net/netstat ListenOverflows grew by 40 during a 3-minute CPU soak, and a
  // GPU soak lost 55 of 17,378 requests as client-side "HTTP failure: Read" that the server never
  // logged (connection-level). Listening again on the bound socket widens the queue (Linux caps
  // it at net.core.somaxconn).
  static constexpr int kListenBacklog = 1024;
  void widen_backlog() {
    M3_CHECK(listen_fd >= 0 && ::listen(listen_fd, kListenBacklog) == 0,
             "serve: cannot widen the listen backlog of socket {} to {}", listen_fd, kListenBacklog);
  }

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)) {
    limits.model = opt.model_name;
    limits.vocab_size = engine.spec().vocab_size;
    limits.max_body_bytes = opt.max_body_bytes;
    limits.max_model_len = engine.max_model_len();
    limits.max_prompt_tokens = opt.max_prompt_tokens > 0 ? std::min(opt.max_prompt_tokens, limits.max_model_len - 1)
                                                         : limits.max_model_len - 1;
    limits.max_completion_tokens = opt.max_completion_tokens > 0
                                       ? std::min(opt.max_completion_tokens, limits.max_model_len - 1)
                                       : limits.max_model_len - 1;
    if (opt.tokenizer) {
      M3_CHECK(opt.tokenizer->vocab_size() == limits.vocab_size,
               "serve: the tokenizer was loaded for a vocabulary of {} ids, the model has {}",
               opt.tokenizer->vocab_size(), limits.vocab_size);
      limits.tokenizer = opt.tokenizer.get();
    }
    M3_CHECK(opt.max_concurrent_requests >= 1, "serve: max concurrent requests must be >= 1, got {}",
             opt.max_concurrent_requests);
    setup();
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_json(e), "application/json");
  }
  static ApiError err(int status, std::string msg, std::string type, std::string code) {
    return ApiError{status, std::move(msg), std::move(type), "", std::move(code)};
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    if (constant_time_equal(req.get_header_value("Authorization"), "Bearer " + opt.api_key)) return true;
    send_error(res, err(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                        "invalid_request_error", "invalid_api_key"));
    return false;
  }

  uint64_t random_seed() {
    std::lock_guard lk(mu);
    return rng();
  }

  // Holds one slot of the concurrency limit while a completion (or its stream) is alive.
  struct Slot {
    Impl* impl;
    ~Slot() {
      std::lock_guard lk(impl->mu);
      impl->active--;
      impl->idle_cv.notify_all();
    }
  };
  std::shared_ptr<Slot> acquire_slot() {
    std::lock_guard lk(mu);
    if (active >= opt.max_concurrent_requests) {
      counters.rejected_busy++;
      return nullptr;
    }
    active++;
    return std::shared_ptr<Slot>(new Slot{this});
  }

  // Reads the request body through httplib's content reader and keeps at most max_body_bytes of
  // it. httplib's own reading checks set_payload_max_length only against a Content-Length header:
  // a chunked body, one without a length, or a compressed one (inflated as it arrives) would be
  // read whole into memory. Beyond the limit the rest is read and dropped, as httplib skips an
  // over-long Content-Length body, so the next request on the connection starts where it should.
  // Returns false, with the error response sent, when the body is too large or unreadable.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body) {
    const size_t cap = opt.max_body_bytes;
    size_t total = 0;
    auto keep = [&](const char* data, size_t n) {
      total += n;
      if (total <= cap) body.append(data, n);
      return true;
    };
    bool ok;
    if (req.is_multipart_form_data())  // drained too; no route takes multipart
      ok = reader([](const httplib::MultipartFormData&) { return true; },
                  [&](const char*, size_t n) {
                    total += n;
                    return true;
                  });
    else
      ok = reader(keep);
    if (total > cap || res.status == 413) {  // 413: Content-Length over the limit (httplib skipped the body)
      body.clear();
      send_error(res, body_too_large_error(cap));
      return false;
    }
    if (!ok) {
      body.clear();
      send_error(res, err(400, "the request body could not be read (bad chunked or compressed encoding?)",
                          "invalid_request_error", "bad_body"));
      return false;
    }
    if (req.is_multipart_form_data()) {
      send_error(res, err(400, "multipart/form-data is not accepted: send the request body as JSON",
                          "invalid_request_error", "unsupported_content_type"));
      return false;
    }
    return true;
  }

  enum class Api { Completions, Chat };

  void completions(const httplib::Request& req, const std::string& body, httplib::Response& res, Api api) {
    if (!authorized(req, res)) return;
    if (draining) return send_error(res, err(503, "the server is shutting down", "server_error", "shutting_down"));
    std::shared_ptr<Slot> slot = acquire_slot();
    if (!slot)
      return send_error(res, err(429, fmt::format("too many concurrent requests (limit {})", opt.max_concurrent_requests),
                                 "rate_limit_error", "too_many_requests"));
    ApiError e;
    std::optional<CompletionParams> p = api == Api::Chat ? parse_chat_request(body, limits, opt.chat_template.get(), e)
                                                         : parse_completion_request(body, limits, e);
    if (!p) return send_error(res, e);

    auto job = std::make_shared<Job>();
    job->stream = p->stream;
    job->choices.resize(p->choices());
    job->unfinished = int(p->choices());
    job->n = p->n;
    job->tokenizer = limits.tokenizer;
    if (p->logprobs >= 0)
      for (auto& c : job->choices) c.logprobs.emplace();
    if (limits.tokenizer)
      for (auto& c : job->choices) {
        c.text_stream = std::make_unique<TextStream>(*limits.tokenizer, p->stop, p->skip_special_tokens);
        if (p->thinking) c.reasoning = std::make_unique<ReasoningSplit>(*p->thinking);
        if (!p->tools.is_null()) c.tools = std::make_unique<ToolCallParser>(p->tools);
      }
    job->call_ids = random_seed();
    for (size_t i = 0; i < p->choices(); ++i) {
      try {
        uint64_t id = engine.submit(p->request(i, random_seed()), [eng = &engine, job, i](const RequestEvent& ev) {
          if (job->on_event(int(i), ev)) eng->cancel(ev.id, "stop string matched");
        });
        std::lock_guard lk(job->mu);
        job->choices[i].engine_id = id;
      } catch (const std::exception& ex) {
        for (size_t k = 0; k < i; ++k) engine.cancel(job->choices[k].engine_id, "request rejected");
        if (engine.draining())
          return send_error(res, err(503, "the server is shutting down", "server_error", "shutting_down"));
        return send_error(res, ApiError{400, ex.what(), "invalid_request_error", "prompt", ""});
      }
    }
    const std::string id = fmt::format("{}-{:016x}", api == Api::Chat ? "chatcmpl" : "cmpl",
                                       next_cmpl++ ^ (random_seed() & 0xffffffff00000000ull));
    const int64_t created = unix_now();
    if (!p->stream) return finish_whole(res, job, id, created, api);
    stream(res, job, id, created, p->include_usage, slot, api);
  }

  void finish_whole(httplib::Response& res, const std::shared_ptr<Job>& job, const std::string& id, int64_t created,
                    Api api) {
    std::unique_lock lk(job->mu);
    job->cv.wait(lk, [&] { return job->unfinished == 0; });
    std::vector<ChoiceResult> out;
    for (size_t i = 0; i < job->choices.size(); ++i) {
      const auto& c = job->choices[i];
      if (c.reason == FinishReason::Error)
        return send_error(res, err(500, "generation failed: " + c.error, "server_error", "engine_error"));
      if (c.reason == FinishReason::Cancelled)
        return send_error(res, err(503, "the request was cancelled: " + c.error, "server_error", "cancelled"));
      ChoiceResult r{.index = int(i), .tokens = c.tokens, .finish_reason = c.finish_name(), .stop_token = c.stop_token,
                     .stop_string = c.stop_string};
      if (c.text_stream) r.text = c.text;
      if (c.reasoning && c.reasoning->reasoned()) r.reasoning = c.reasoning_text;
      r.tool_calls = c.calls;
      r.logprobs = c.logprobs;
      out.push_back(std::move(r));
    }
    res.set_content(api == Api::Chat ? chat_completion_json(id, created, opt.model_name, out, job->usage())
                                     : completion_json(id, created, opt.model_name, out, job->usage()),
                    "application/json");
  }

  void stream(httplib::Response& res, std::shared_ptr<Job> job, std::string id, int64_t created, bool include_usage,
              std::shared_ptr<Slot> slot, Api api) {
    struct State {
      std::vector<size_t> emitted;
      std::vector<bool> started;
      bool failed = false;
    };
    auto st = std::make_shared<State>();
    st->emitted.assign(job->choices.size(), 0);
    st->started.assign(job->choices.size(), false);
    auto keepalive = std::chrono::duration<double>(opt.stream_keepalive_s);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, st, id, created, include_usage, keepalive, slot, api](size_t, httplib::DataSink& sink) -> bool {
          std::unique_lock lk(job->mu);
          bool woke = job->cv.wait_for(lk, keepalive, [&] { return !job->events.empty() || job->unfinished == 0; });
          std::deque<Job::Event> evs;
          evs.swap(job->events);
          const bool all_done = job->unfinished == 0;
          const Usage usage = job->usage();
          lk.unlock();
          std::string out;
          for (auto& e : evs) {
            if (e.reason == FinishReason::Cancelled || e.reason == FinishReason::Error) {
              ApiError ae = e.reason == FinishReason::Error
                                ? err(500, "generation failed: " + e.error, "server_error", "engine_error")
                                : err(503, "the request was cancelled: " + e.error, "server_error", "cancelled");
              out += "data: " + error_json(ae) + "\n\n";
              st->failed = true;
              continue;
            }
            const size_t k = size_t(e.result.index);
            out += "data: " +
                   (api == Api::Chat ? chat_chunk_json(id, created, opt.model_name, e.result, !st->started[k])
                                     : chunk_json(id, created, opt.model_name, e.result, st->emitted[k] > 0)) +
                   "\n\n";
            st->emitted[k] += e.result.tokens.size();
            st->started[k] = true;
          }
          if (all_done) {
            if (include_usage && !st->failed)
              out += "data: " +
                     (api == Api::Chat ? chat_usage_chunk_json(id, created, opt.model_name, usage)
                                       : usage_chunk_json(id, created, opt.model_name, usage)) +
                     "\n\n";
            out += "data: [DONE]\n\n";
          }
          if (out.empty() && !woke) out = ": keep-alive\n\n";  // a write is how a gone client shows up
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (all_done) sink.done();
          return true;
        },
        [this, job](bool success) {
          if (success) return;
          // The client went away (or the listener stopped): free the engine's work and blocks.
          std::vector<uint64_t> ids;
          {
            std::lock_guard lk(job->mu);
            for (const auto& c : job->choices)
              if (!c.finished) ids.push_back(c.engine_id);
          }
          for (uint64_t i : ids) engine.cancel(i, "client disconnected");
          std::lock_guard lk(mu);
          counters.client_disconnects++;
        });
  }

  void setup() {
    http.new_task_queue = [n = opt.http_threads > 0 ? opt.http_threads : opt.max_concurrent_requests + 8] {
      return new httplib::ThreadPool(size_t(n));
    };
    http.set_payload_max_length(opt.max_body_bytes);
    // NOTE: httplib's default sets SO_REUSEPORT, which lets a second server bind a port that is
    // already serving (and silently share its traffic). SO_REUSEADDR alone still allows a quick
    // restart over TIME_WAIT connections, but a live listener makes bind() fail.
    http.set_socket_options([this](auto sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd = int(sock);
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      std::lock_guard lk(mu);
      counters.responses_by_code[res.status]++;
    });
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                        httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      ApiError e{res.status, "", "invalid_request_error", "", ""};
      switch (res.status) {
        case 404:
          e.message = fmt::format("no route for {} {}", req.method, req.path);
          e.code = "not_found";
          break;
        case 413:
          e = body_too_large_error(opt.max_body_bytes);
          break;
        default:
          e.message = fmt::format("HTTP error {}", res.status);
          if (res.status >= 500) e.type = "server_error";
      }
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      send_error(res, err(500, "internal error: " + what, "server_error", "internal_error"));
    });

    // Every request that carries a body (POST, PUT, PATCH, DELETE) goes to a content-reader
    // handler, which reads it through read_body: a plain handler would have httplib read it
    // unbounded first. Handlers match in the order registered; the catch-alls come last.
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                std::string body;
                if (read_body(req, res, reader, body)) completions(req, body, res, Api::Completions);
              });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                std::string body;
                if (read_body(req, res, reader, body)) completions(req, body, res, Api::Chat);
              });
    http.Post("/tokenize",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                std::string body;
                if (!read_body(req, res, reader, body) || !authorized(req, res)) return;
                ApiError e;
                auto ids = parse_tokenize_request(body, limits, opt.chat_template.get(), e);
                if (!ids) return send_error(res, e);
                res.set_content(tokenize_json(*ids, limits.max_model_len), "application/json");
              });
    http.Post("/detokenize",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                std::string body;
                if (!read_body(req, res, reader, body) || !authorized(req, res)) return;
                ApiError e;
                auto text = parse_detokenize_request(body, limits, e);
                if (!text) return send_error(res, e);
                res.set_content(detokenize_json(*text), "application/json");
              });
    http.Get("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      send_error(res, err(405, "use POST for /v1/completions", "invalid_request_error", "method_not_allowed"));
    });
    for (const char* path : {"/v1/embeddings"})
      http.Post(path, [this, path](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
        std::string body;
        if (!read_body(req, res, reader, body)) return;
        send_error(res, err(404, fmt::format("{} is not served (yet): use /v1/completions with a text prompt or token ids",
                                             path),
                            "invalid_request_error", "not_found"));
      });
    // Any other path: the body is read (bounded) and dropped; the error handler then writes the
    // same 404 "no route" that an unrouted request gets.
    auto no_route = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) res.status = 404;
    };
    const char* any_path = R"([\s\S]*)";  // not ".*": a decoded path may hold a newline ("%0A")
    http.Post(any_path, no_route);
    http.Put(any_path, no_route);
    http.Patch(any_path, no_route);
    http.Delete(any_path, no_route);
    // PRI (the HTTP/2 preface) is the one other method httplib reads a body for, and no
    // content-reader handler can take it: refuse it before its body is read.
    http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (req.method != "PRI") return httplib::Server::HandlerResponse::Unhandled;
      res.status = 404;
      return httplib::Server::HandlerResponse::Handled;
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      res.set_content(models_json(limits, unix_now()), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (draining) {
        res.status = 503;
        res.set_content(R"({"status":"draining"})", "application/json");
        return;
      }
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_metrics(engine.stats(), snapshot(), opt.model_name), "text/plain; version=0.0.4; charset=utf-8");
    });
  }

  ServerCounters snapshot() const {
    std::lock_guard lk(mu);
    ServerCounters c = counters;
    c.active_requests = active;
    return c;
  }
};

Server::Server(Engine& engine, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, std::move(opt))) {}
Server::~Server() {
  if (impl_->http.is_running()) impl_->http.stop();
}

int Server::bind() {
  auto& o = impl_->opt;
  if (o.port == 0) {
    int port = impl_->http.bind_to_any_port(o.host);
    M3_CHECK(port > 0, "serve: cannot bind {} (any port)", o.host);
    impl_->widen_backlog();
    return port;
  }
  M3_CHECK(impl_->http.bind_to_port(o.host, o.port), "serve: cannot bind {}:{} (in use, or not a local address?)",
           o.host, o.port);
  impl_->widen_backlog();
  return o.port;
}

void Server::serve() { impl_->http.listen_after_bind(); }

void Server::shutdown(double grace_s) {
  impl_->draining = true;
  impl_->engine.shutdown(std::chrono::milliseconds(int64_t(grace_s * 1000)));
  {
    // Streams write their last events once the engine has finished or cancelled them.
    std::unique_lock lk(impl_->mu);
    impl_->idle_cv.wait_for(lk, std::chrono::seconds(5), [&] { return impl_->active == 0; });
  }
  impl_->http.stop();
}

bool Server::is_running() const { return impl_->http.is_running(); }
ServerCounters Server::counters() const { return impl_->snapshot(); }

}  // namespace m3::serve
