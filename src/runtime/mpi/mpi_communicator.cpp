// make_mpi_communicator (runtime/mpi/mpi_communicator.h).
#include "runtime/mpi/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/check.h"
#include "runtime/mpi/peer_liveness.h"

namespace m3 {

namespace {

void finalize_at_exit() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  stop_peer_liveness();  // goodbye to the peers, the heartbeat thread done before MPI ends
  MPI_Finalize();
}

double timeout_s() {
  const char* e = std::getenv("M3_TP_TIMEOUT_S");
  const double v = e ? std::atof(e) : 600.0;
  return v > 0 ? v : 600.0;
}

// What a rank is about to call: kind (1 all_reduce_sum, 2 broadcast, 3 all_gather), bytes, root.
struct Call {
  int64_t kind = 0, bytes = 0, root = 0;
};
std::string describe(const Call& c) {
  switch (c.kind) {
    case 1: return fmt::format("all_reduce_sum of {} floats", c.bytes / 4);
    case 2: return fmt::format("broadcast of {} bytes from rank {}", c.bytes, c.root);
    case 3: return fmt::format("all_gather of {} bytes", c.bytes);
    default: return "nothing";
  }
}

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    timeout_ = timeout_s();
  }
  ~MpiComm() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t n) override {
    agree_on(Call{1, int64_t(n * 4), 0});
    std::vector<float> all(n * size_t(size_));
    wait("all_reduce_sum", [&](MPI_Request* r) {
      MPI_Iallgather(data, int(n), MPI_FLOAT, all.data(), int(n), MPI_FLOAT, comm_, r);
    });
    for (size_t i = 0; i < n; ++i) {
      float acc = all[i];
      for (int k = 1; k < size_; ++k) acc = acc + all[size_t(k) * n + i];
      data[i] = acc;
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    agree_on(Call{2, int64_t(bytes), root});
    M3_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root, size_);
    wait("broadcast", [&](MPI_Request* r) { MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, r); });
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    agree_on(Call{3, int64_t(bytes), 0});
    wait("all_gather", [&](MPI_Request* r) {
      MPI_Iallgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, comm_, r);
    });
  }
  void set_wait_limit(std::chrono::milliseconds limit, const std::string& meaning) override {
    timeout_ = limit.count() > 0 ? double(limit.count()) / 1000.0 : timeout_s();
    meaning_ = limit.count() > 0 ? meaning : std::string();
  }
  void fail(const std::string& why) override {
    std::fprintf(stderr, "m3mono: tensor-parallel rank %d of %d leaves the group: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, 1);
  }

 private:
  // Every rank's next call, checked on every rank (the same verdict everywhere).
  void agree_on(const Call& mine) {
    M3_CHECK(mine.bytes <= (int64_t(1) << 31) - 1, "tensor-parallel group: a collective of {} bytes (at most 2 GiB)",
             mine.bytes);
    std::vector<Call> all(static_cast<size_t>(size_));
    wait("the call check", [&](MPI_Request* r) {
      MPI_Iallgather(&mine, int(sizeof(Call)), MPI_BYTE, all.data(), int(sizeof(Call)), MPI_BYTE, comm_, r);
    });
    std::string mismatch;
    for (int k = 1; k < size_; ++k)
      if (std::memcmp(&all[size_t(k)], &all[0], sizeof(Call)) != 0)
        mismatch += fmt::format("; rank {} called '{}'", k, describe(all[size_t(k)]));
    M3_CHECK(mismatch.empty(), "tensor-parallel group (rank {} of {}): ranks called different collectives: rank 0 "
             "called '{}'{}", rank_, size_, describe(all[0]), mismatch);
  }
  // Starts a non-blocking collective and waits for it, at most the timeout; then aborts the job.
  template <class Start>
  void wait(const char* what, Start start) {
    MPI_Request req;
    start(&req);
    const auto t0 = std::chrono::steady_clock::now();
    double next_left_check = 2.0;
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // a peer that said goodbye (its process ended in order) will not join: past a grace for its
      // last messages to land, fail now rather than at the timeout (looked at every 50 ms, not on
      // every poll)
      if (waited > next_left_check) {
        next_left_check = waited + 0.05;
        const std::string gone = peers_left();
        if (!gone.empty())
          fail(fmt::format("{} cannot complete: {} of {} left the group (ended in order) without joining it", what,
                           gone, size_));
      }
      if (waited > timeout_)
        fail(meaning_.empty()
                 ? fmt::format("{} did not complete within {:.0f} s (M3_TP_TIMEOUT_S): a rank is stuck", what, timeout_)
                 : fmt::format("{} did not complete within {:.0f} s: {}", what, timeout_, meaning_));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  double timeout_ = 600;
  std::string meaning_;  // what a wait past timeout_ means ("": a rank is stuck)
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  M3_CHECK(mpi_launched(), "tensor parallelism over MPI: this process was not started by mpirun (run `mpirun -np N "
           "m3mono ... --tp N`)");
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    // multiple: the liveness watch (runtime/mpi/peer_liveness.h) calls MPI on its own thread while
    // the collectives run; serialized at least: rank 0's steps (the scheduler's or the server's
    // thread) and its heartbeat to the followers (runtime/tp_leader.h) call MPI from different
    // threads, never at the same time
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit(finalize_at_exit);
    M3_CHECK(provided >= MPI_THREAD_SERIALIZED, "tensor parallelism over MPI: this MPI provides thread level {}, "
             "below MPI_THREAD_SERIALIZED ({}), which rank 0's heartbeat thread needs", provided,
             int(MPI_THREAD_SERIALIZED));
  }
  auto comm = std::make_unique<MpiComm>();
  LivenessOptions live;
  live.silence = liveness_silence_from_env();
  if (!start_peer_liveness(MPI_COMM_WORLD, live) && comm->rank() == 0 && comm->size() > 1 && live.silence.count() > 0)
    std::fprintf(stderr, "m3mono: note: this MPI has no MPI_THREAD_MULTIPLE, so no heartbeat watch runs: a hung rank "
                 "ends the job only at M3_TP_TIMEOUT_S\n");
  return comm;
}

}  // namespace m3
