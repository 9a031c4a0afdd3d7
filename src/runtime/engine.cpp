// Engine: the step loop thread, its inbox, and the stats it publishes.
#include "runtime/engine.h"

#include "core/check.h"

namespace m3 {

namespace {
Backend& checked(const std::unique_ptr<Backend>& b) {
  M3_CHECK(b != nullptr, "engine: the backend is null");
  return *b;
}
}  // namespace

Engine::Engine(std::unique_ptr<Backend> backend, EngineOptions opt)
    : backend_(std::move(backend)),
      spec_(checked(backend_).spec()),
      opt_(opt),
      sched_(*backend_, opt.scheduler),
      max_model_len_(sched_.max_model_len()) {
  stats_.backend = backend_->name();
  stats_.cache_blocks_total = sched_.blocks().num_blocks();
  stats_.cache_block_size = sched_.blocks().block_size();
  stats_.step_latency = Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  stats_.batch_size = Histogram({1, 2, 4, 8, 16, 32, 64, 128, 256});
  // vLLM's buckets, with finer ones below its smallest (a decode step here can take a millisecond)
  stats_.time_to_first_token = Histogram({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                          5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0});
  stats_.inter_token_latency = Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                          0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0});
  stats_.e2e_latency = Histogram({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                  50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0});
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(std::chrono::milliseconds(0)); }

uint64_t Engine::submit(GenerationRequest r, EventCallback cb) {
  sched_.validate(r);  // reads only immutable state: safe off the engine thread
  std::lock_guard lk(mu_);
  M3_CHECK(!draining_.load() && !stop_, "engine: shutting down, not accepting requests");
  uint64_t id = next_id_++;
  live_++;
  stats_.requests_submitted++;
  // Runs on the engine thread. On the final event the freed blocks are published before the
  // client hears of it (so its next /metrics read sees them), and the request stops counting as
  // live only after its callback returned (so wait_idle() implies every callback ran).
  using Clock = std::chrono::steady_clock;
  EventCallback wrapped = [this, cb = std::move(cb), submitted = Clock::now(), last = Clock::time_point{},
                           tokens = uint64_t(0)](const RequestEvent& ev) mutable {
    const auto now = Clock::now();
    if (!ev.new_tokens.empty() || ev.finished) {
      std::lock_guard g(mu_);
      if (!ev.new_tokens.empty()) {
        const size_t k = ev.new_tokens.size();
        if (tokens == 0) {
          stats_.time_to_first_token.observe(std::chrono::duration<double>(now - submitted).count());
          for (size_t i = 1; i < k; ++i) stats_.inter_token_latency.observe(0.0);
        } else {
          const double gap = std::chrono::duration<double>(now - last).count() / double(k);
          for (size_t i = 0; i < k; ++i) stats_.inter_token_latency.observe(gap);
        }
        tokens += k;
        last = now;
      }
      if (ev.finished) {
        stats_.e2e_latency.observe(std::chrono::duration<double>(now - submitted).count());
        publish_gauges();
      }
    }
    if (cb) cb(ev);
    if (ev.finished) {
      std::lock_guard g(mu_);
      live_--;
      stats_.requests_finished[finish_reason_name(ev.reason)]++;
      idle_cv_.notify_all();
    }
  };
  inbox_.push_back(Pending{id, std::move(r), std::move(wrapped)});
  cv_.notify_one();
  return id;
}

void Engine::cancel(uint64_t id, std::string why) {
  std::lock_guard lk(mu_);
  cancels_.emplace_back(id, std::move(why));
  cv_.notify_one();
}

bool Engine::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  // (and the step that finished the last one is counted in stats())
  return idle_cv_.wait_for(lk, timeout, [&] { return live_ == 0 && !stepping_; });
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  draining_ = true;
  if (grace.count() > 0) wait_idle(grace);
  {
    std::lock_guard lk(mu_);
    cancel_all_ = true;
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::loop() {
  std::unique_lock lk(mu_);
  bool has_work = false;
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || cancel_all_ || has_work || !inbox_.empty() || !cancels_.empty(); });
    std::deque<Pending> inbox;
    inbox.swap(inbox_);
    std::vector<std::pair<uint64_t, std::string>> cancels;
    cancels.swap(cancels_);
    bool cancel_all = std::exchange(cancel_all_, false) || stop_;
    bool stop = stop_;
    stepping_ = true;
    lk.unlock();

    for (auto& p : inbox) {
      try {
        sched_.add(p.id, std::move(p.req), p.cb);
      } catch (const std::exception& e) {
        RequestEvent ev;
        ev.id = p.id;
        ev.finished = true;
        ev.reason = FinishReason::Error;
        ev.error = e.what();
        p.cb(ev);
      }
    }
    for (auto& [id, why] : cancels) sched_.cancel(id, why);
    if (cancel_all) sched_.cancel_all("server shutting down");
    StepReport rep;
    if (sched_.has_work()) rep = sched_.step();

    lk.lock();
    has_work = sched_.has_work();
    publish_gauges();
    if (rep.ran) record(rep);
    stepping_ = false;
    idle_cv_.notify_all();
    if (stop && !has_work && inbox_.empty()) break;
  }
}

void Engine::publish_gauges() {
  stats_.waiting = sched_.num_waiting();
  stats_.running = sched_.num_running();
  stats_.cache_blocks_used = sched_.blocks().num_used();
}

void Engine::record(const StepReport& rep) {
  stats_.steps++;
  stats_.prompt_tokens += uint64_t(rep.prefill_tokens);
  stats_.generation_tokens += uint64_t(rep.generated);
  stats_.preemptions += uint64_t(rep.preempted);
  stats_.spec_verify_rows += uint64_t(rep.verify_rows);
  stats_.spec_draft_tokens += uint64_t(rep.drafted);
  stats_.spec_accepted_tokens += uint64_t(rep.accepted);
  if (!rep.error.empty()) stats_.step_errors++;
  stats_.step_latency.observe(rep.seconds);
  stats_.batch_size.observe(rep.num_seqs);
  stats_.steps_by_path[rep.path]++;
  if (!rep.fallback_reason.empty()) stats_.fallbacks[{rep.path, rep.fallback_reason}]++;
  auto now = std::chrono::steady_clock::now();
  recent_.emplace_back(now, rep.generated);
  auto window = std::chrono::duration<double>(opt_.rate_window_s);
  while (!recent_.empty() && now - recent_.front().first > window) recent_.pop_front();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats s = stats_;
  auto now = std::chrono::steady_clock::now();
  auto window = std::chrono::duration<double>(opt_.rate_window_s);
  uint64_t toks = 0;
  for (const auto& [t, n] : recent_)
    if (now - t <= window) toks += uint64_t(n);
  s.tokens_per_second = opt_.rate_window_s > 0 ? double(toks) / opt_.rate_window_s : 0;
  return s;
}

}  // namespace m3
