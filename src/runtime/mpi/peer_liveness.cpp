// The heartbeat watch over an mpirun job's processes (runtime/mpi/peer_liveness.h).
#include "runtime/mpi/peer_liveness.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

namespace {

constexpr int kTagBeat = 1, kTagBye = 2;
const int kPayload = 0;  // what a beat carries (the tag is the message); static: sends outlive the call

class Watch {
 public:
  Watch(MPI_Comm world, LivenessOptions opt) : opt_(opt) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // a send to a dead peer is mpirun's to report
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    const auto now = Clock::now();
    last_.assign(size_t(size_), now);
    left_.assign(size_t(size_), false);
    thread_ = std::thread([this] { run(); });
  }
  // Goodbye to the peers, then the thread ends (its own communicator is left to MPI_Finalize).
  void stop() {
    if (stopping_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
  }
  std::string left() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (int k = 0; k < size_; ++k)
      if (left_[size_t(k)]) s += fmt::format("{}rank {}", s.empty() ? "" : ", ", k);
    return s;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void send_all(int tag) {
    for (int k = 0; k < size_; ++k) {
      if (k == rank_ || is_left(k)) continue;
      MPI_Request r;
      if (MPI_Isend(&kPayload, 1, MPI_INT, k, tag, comm_, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    }
  }
  bool is_left(int k) {
    std::lock_guard<std::mutex> lock(mu_);
    return left_[size_t(k)];
  }
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st) != MPI_SUCCESS || !flag) return;
      int v = 0;
      MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG, comm_, MPI_STATUS_IGNORE);
      last_[size_t(st.MPI_SOURCE)] = Clock::now();
      if (st.MPI_TAG == kTagBye) {
        std::lock_guard<std::mutex> lock(mu_);
        left_[size_t(st.MPI_SOURCE)] = true;
      }
    }
  }
  void run() {
    auto sent = Clock::now() - opt_.beat;
    while (!stopping_.load()) {
      const auto now = Clock::now();
      if (now - sent >= opt_.beat) {
        send_all(kTagBeat);
        sent = now;
      }
      drain();
      for (int k = 0; k < size_; ++k) {
        if (k == rank_ || is_left(k)) continue;
        const double quiet = std::chrono::duration<double>(Clock::now() - last_[size_t(k)]).count();
        if (quiet * 1000.0 > double(opt_.silence.count())) {
          std::fprintf(stderr,
                       "m3mono: tensor-parallel rank %d of %d: rank %d has sent no heartbeat for %.1f s (it hangs, is "
                       "stopped, or its host is gone); ending the job (M3_TP_LIVENESS_S sets this limit)\n",
                       rank_, size_, k, quiet);
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    send_all(kTagBye);
  }

  LivenessOptions opt_;
  MPI_Comm comm_{};
  int rank_ = 0, size_ = 1;
  std::vector<Clock::time_point> last_;  // the thread's own
  std::mutex mu_;
  std::vector<bool> left_;  // under mu_
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

std::mutex g_mu;
Watch* g_watch = nullptr;  // lives until the process ends (stopped before MPI_Finalize)

}  // namespace

std::chrono::milliseconds liveness_silence_from_env() {
  const char* e = std::getenv("M3_TP_LIVENESS_S");
  if (!e || !*e) return std::chrono::milliseconds(7000);
  const double v = std::atof(e);
  return std::chrono::milliseconds(v > 0 ? int64_t(v * 1000.0) : 0);
}

bool start_peer_liveness(MPI_Comm world, LivenessOptions opt) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_watch) return true;
  int provided = 0, size = 1;
  MPI_Query_thread(&provided);
  MPI_Comm_size(world, &size);
  if (provided < MPI_THREAD_MULTIPLE || size < 2 || opt.silence.count() <= 0) return false;
  g_watch = new Watch(world, opt);
  return true;
}

void stop_peer_liveness() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_watch) g_watch->stop();
}

std::string peers_left() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_watch ? g_watch->left() : std::string();
}

}  // namespace m3
