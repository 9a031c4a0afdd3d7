// A small fixed-size thread pool with one blocking primitive, parallel_for, for host work (the CPU
// reference's matrix-vector products, heads, experts). Results never depend on the thread count as
// long as each output element is written by exactly one index of the loop and computed with its
// own fixed reduction order: the pool only decides WHO runs an index, never how it is computed.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

class ThreadPool {
 public:
  // threads: total workers including the calling thread; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each chunk at most `grain` long
  // (grain <= 0: about n / (4 * size()) ), and returns when all are done. The calling thread
  // works too. A call made from inside a running parallel_for runs inline on that thread (no
  // nesting, no deadlock). The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 0);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  // the job in flight (guarded by mu_ except the atomic-like counters below, also under mu_)
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1, next_ = 0;
  int active_ = 0;          // workers currently inside the job
  uint64_t generation_ = 0; // bumped per job so sleeping workers see a new one
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex call_mu_;      // one parallel_for at a time from outside threads
};

}  // namespace m3
