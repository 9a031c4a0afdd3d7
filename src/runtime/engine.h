// The engine: a Scheduler running on its own thread. submit() and cancel() may be called from any
// thread; events are delivered on the engine thread. Shutdown either lets queued and running
// requests finish (up to a grace period) or cancels them, then joins the thread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/backend.h"
#include "runtime/engine_stats.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace m3 {

struct EngineOptions {
  SchedulerOptions scheduler;
  double rate_window_s = 5.0;  // window of the tokens/s gauge
};

class Engine {
 public:
  // Takes the backend (which chooses its execution path per step itself: StepOutput::path).
  explicit Engine(std::unique_ptr<Backend> backend, EngineOptions opt = {});
  ~Engine();  // cancels whatever is left and joins
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates `r` on the caller's thread (throws m3::Error naming the bad field, or when the engine
  // is shutting down) and queues it. Returns the request id.
  uint64_t submit(GenerationRequest r, EventCallback cb);
  // Asynchronous: the request ends with FinishReason::Cancelled at the next step boundary. Unknown
  // or finished ids are ignored.
  void cancel(uint64_t id, std::string why = "cancelled");
  // Stops accepting requests, waits up to `grace` for the live ones to finish, cancels the rest
  // and joins the engine thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  // True once shutdown() has begun.
  bool draining() const { return draining_.load(); }
  // Blocks until no request is queued or running and the last step is counted in stats() (or the
  // timeout passes); true if idle.
  bool wait_idle(std::chrono::milliseconds timeout);

  EngineStats stats() const;
  const ModelSpec& spec() const { return spec_; }
  int max_model_len() const { return max_model_len_; }

 private:
  struct Pending {
    uint64_t id;
    GenerationRequest req;
    EventCallback cb;
  };
  void loop();
  void record(const StepReport& rep);  // with mu_ held
  void publish_gauges();               // engine thread, with mu_ held

  std::unique_ptr<Backend> backend_;
  ModelSpec spec_;
  EngineOptions opt_;
  Scheduler sched_;  // engine thread only
  int max_model_len_ = 0;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes wait_idle()
  std::deque<Pending> inbox_;
  std::vector<std::pair<uint64_t, std::string>> cancels_;
  bool stop_ = false;        // engine thread exits when set
  bool cancel_all_ = false;  // cancel every live request at the next boundary
  int live_ = 0;             // submitted and not yet finished
  bool stepping_ = false;    // the engine thread is inside a step whose report is not recorded yet
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  EngineStats stats_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int>> recent_;  // (step end, tokens sampled)
  std::thread thread_;
};

}  // namespace m3
