// ThreadPool: workers sleep on a condition variable; a job is a loop range handed out in chunks
// under one mutex (chunks are coarse, so the lock is not a bottleneck).
#include "core/parallel.h"

#include <algorithm>
#include <exception>

namespace m3 {

namespace {
thread_local bool t_inside_pool = false;  // true while this thread runs a parallel_for chunk
}

ThreadPool::ThreadPool(int threads) {
  int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t b, e;
    {
      std::lock_guard lk(mu_);
      if (next_ >= n_) return;
      b = next_;
      e = std::min(n_, b + grain_);
      next_ = e;
    }
    try {
      t_inside_pool = true;
      (*fn_)(b, e);
      t_inside_pool = false;
    } catch (...) {
      t_inside_pool = false;
      std::lock_guard lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_ = n_;  // abandon the rest of the loop
      return;
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_chunks();
    {
      std::lock_guard lk(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  if (grain <= 0) grain = std::max<int64_t>(1, n / (4 * int64_t(size())));
  if (workers_.empty() || t_inside_pool || n <= grain) {
    // inline: single thread, nested call, or a single chunk
    bool was = t_inside_pool;
    t_inside_pool = true;
    try {
      for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    } catch (...) {
      t_inside_pool = was;
      throw;
    }
    t_inside_pool = was;
    return;
  }
  std::lock_guard call(call_mu_);
  {
    std::lock_guard lk(mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  cv_work_.notify_all();
  run_chunks();
  std::exception_ptr err;
  {
    std::unique_lock lk(mu_);
    // every chunk is claimed once run_chunks returned here; wait for workers still inside
    cv_done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
    n_ = next_ = 0;  // a worker waking late finds nothing to claim
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace m3
