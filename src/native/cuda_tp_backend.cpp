// make_cuda_tp_backend (native/cuda_tp_backend.h): ranks as threads, each with its CUDA device.
#include "native/cuda_tp_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "native/cuda_check.h"
#include "native/device_comm.h"
#include "native/prepared.h"
#include "runtime/communicator.h"

namespace m3::native {

namespace {

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// One thread per rank that runs the jobs it is given, one at a time, with the rank's device
// current (CUDA's current device is per thread).
class RankThread {
 public:
  explicit RankThread(int device) : device_(device), th_([this] { loop(); }) {}
  ~RankThread() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lk(m_);
    job_ = std::move(job);
    done_ = false;
    err_ = nullptr;
    cv_.notify_all();
  }
  // Waits for the posted job; its exception, if any.
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return done_; });
    return err_;
  }
  // Whether the posted job ended by `until` (then *err is its exception, if any).
  bool wait_until(std::chrono::steady_clock::time_point until, std::exception_ptr* err) {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_until(lk, until, [&] { return done_; })) return false;
    *err = err_;
    return true;
  }

 private:
  void loop() {
    bool device_set = false;
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return quit_ || job_; });
        if (quit_ && !job_) return;
        job = std::move(job_);
        job_ = nullptr;
      }
      std::exception_ptr e;
      try {
        if (!device_set) {
          M3_CUDA_CHECK(cudaSetDevice(device_));
          device_set = true;
        }
        job();
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(m_);
      err_ = e;
      done_ = true;
      cv_.notify_all();
    }
  }

  int device_;
  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true, quit_ = false;
  std::exception_ptr err_;
  std::thread th_;  // last: starts after the members it reads
};

class CudaTpBackend final : public Backend {
 public:
  CudaTpBackend(const RankWeightsLoader& load, const CudaTpOptions& opt) : opt_(opt) {
    const int N = opt.tp;
    const int gpus = visible_devices();
    M3_CHECK(gpus > 0, "cuda tp: no CUDA device is visible");
    engine_ = cuda_tp_comm_choice(opt);
    for (int r = 0; r < N; ++r) {
      const int dev = opt.devices.empty() ? r % gpus : opt.devices[size_t(r)];
      threads_.push_back(std::make_unique<RankThread>(dev));
    }
    LocalGroup group(N);
    std::vector<std::shared_ptr<Communicator>> host(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) host[size_t(r)] = group.rank(r);
    ranks_.resize(size_t(N));
    comms_.resize(size_t(N));
    // every rank's weights first (no collective: a rank that fails to load fails the whole start
    // before any rank waits on another), then the communicators, whose creation is collective
    std::vector<std::shared_ptr<const PreparedWeights>> weights(static_cast<size_t>(N));
    run_all("load its weights", [&](int r) {
      weights[size_t(r)] = load(r);
      M3_CHECK(weights[size_t(r)] != nullptr, "cuda tp: rank {}: no weights", r);
    });
    run_all("start", [&](int r) {
      CudaBackendOptions bo = opt.backend;
      bo.device = -1;  // the thread's
      bo.comm = engine_ == "nccl" ? std::shared_ptr<DeviceComm>(make_nccl_comm(*host[size_t(r)]))
                                  : std::shared_ptr<DeviceComm>(make_host_staged_comm(host[size_t(r)]));
      comms_[size_t(r)] = bo.comm;
      ranks_[size_t(r)] = make_cuda_backend(std::move(weights[size_t(r)]), bo);
    });
    spec_ = ranks_[0]->spec();
  }

  ~CudaTpBackend() override {
    // each rank's backend is destroyed on its own thread (its device current)
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r]) continue;
      threads_[r]->post([this, r] { ranks_[r].reset(); });
    }
    for (size_t r = 0; r < ranks_.size(); ++r) (void)threads_[r]->wait();
  }

  std::string name() const override { return fmt::format("cuda-native tp{} ({})", opt_.tp, engine_); }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return ranks_[0]->cache_block_size(); }
  int num_cache_blocks() const override { return ranks_[0]->num_cache_blocks(); }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    M3_CHECK(broken_.empty(), "cuda tp{}: the rank group is broken: {}", opt_.tp, broken_);
    M3_CHECK(trace == nullptr, "cuda tp{}: selection traces come from one rank's heads; trace with --tp 1 (or the "
             "CPU reference, which merges its ranks' traces)", opt_.tp);
    std::vector<StepOutput> outs(ranks_.size());
    const int64_t step = steps_++;
    run_all("step", [&](int r) {
      M3_CHECK(!(r == opt_.fault_rank && step == opt_.fault_step), "cuda tp: rank {}: injected fault at step {}", r,
               step);
      outs[size_t(r)] = ranks_[size_t(r)]->step(batch, nullptr);
    });
    return std::move(outs[0]);
  }

 private:
  // f(rank) on every rank's thread at once; the first failure (by rank) is rethrown naming the rank
  // (an m3::Error's message is kept: the ranks validate alike, so a bad batch fails on all of them).
  // A rank that fails while others wait for it in a collective: once a failure is seen, the others
  // get kFailGrace to end too, then every rank's collectives are aborted (the others' calls fail
  // instead of waiting forever) and the group is broken from then on.
  void run_all(const char* what, const std::function<void(int)>& f) {
    using clock = std::chrono::steady_clock;
    constexpr auto kFailGrace = std::chrono::seconds(10);
    const int N = int(threads_.size());
    for (int r = 0; r < N; ++r) threads_[size_t(r)]->post([&f, r] { f(r); });
    std::vector<char> done(size_t(N), 0);
    std::exception_ptr first;
    int first_rank = -1, left = N;
    clock::time_point deadline = clock::time_point::max();
    bool aborted = false;
    while (left > 0) {
      for (int r = 0; r < N; ++r) {
        if (done[size_t(r)]) continue;
        std::exception_ptr e;
        if (aborted) {
          e = threads_[size_t(r)]->wait();  // its collectives fail now
        } else if (!threads_[size_t(r)]->wait_until(std::min(deadline, clock::now() + std::chrono::milliseconds(20)),
                                                    &e)) {
          continue;
        }
        done[size_t(r)] = 1;
        --left;
        if (e && !first) {
          first = e;
          first_rank = r;
          deadline = clock::now() + kFailGrace;
        }
      }
      if (left > 0 && !aborted && clock::now() >= deadline) {
        const std::string msg = error_text(first);
        broken_ = fmt::format("rank {} failed to {} ({}) and {} rank(s) still waited {} s later", first_rank, what,
                              msg, left, std::chrono::duration_cast<std::chrono::seconds>(kFailGrace).count());
        for (auto& c : comms_)
          if (c) c->abort(broken_);
        aborted = true;
      }
    }
    if (!first) return;
    if (broken_.empty()) {  // a failure on every rank alike (a malformed batch) leaves the group usable
      std::vector<std::string> msgs;
      for (int r = 0; r < N; ++r) msgs.push_back(error_text(threads_[size_t(r)]->wait()));
      bool alike = true;
      for (int r = 1; r < N; ++r) alike = alike && !msgs[0].empty() && msgs[size_t(r)] == msgs[0];
      if (!alike)
        broken_ = fmt::format("rank {} failed to {} ({}) and not every rank failed alike", first_rank, what,
                              error_text(first));
    }
    if (!broken_.empty()) M3_FAIL("cuda tp{}: {}", N, broken_);
    try {
      std::rethrow_exception(first);
    } catch (const Error& e) {
      if (std::string(what) == "step") throw;
      M3_FAIL("cuda tp{}: rank {} failed to {}: {}", N, first_rank, what, e.what());
    }
  }

  static std::string error_text(const std::exception_ptr& e) {
    if (!e) return "";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "unknown error";
    }
  }

  CudaTpOptions opt_;
  std::string engine_;
  int64_t steps_ = 0;
  ModelSpec spec_;
  std::vector<std::unique_ptr<RankThread>> threads_;
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  std::vector<std::shared_ptr<DeviceComm>> comms_;
  std::string broken_;  // why the group cannot run steps any more ("" while it can)
};

}  // namespace

std::string cuda_tp_comm_choice(const CudaTpOptions& opt, std::string* why) {
  M3_CHECK(opt.tp >= 1 && opt.tp <= 64, "cuda tp: --tp must be in [1, 64], got {}", opt.tp);
  M3_CHECK(opt.comm == "auto" || opt.comm == "nccl" || opt.comm == "host",
           "cuda tp: --tp-comm must be auto, nccl or host, got '{}'", opt.comm);
  const int gpus = visible_devices();
  M3_CHECK(opt.devices.empty() || int(opt.devices.size()) == opt.tp, "cuda tp: {} devices listed for {} ranks",
           opt.devices.size(), opt.tp);
  for (int d : opt.devices) M3_CHECK(d >= 0 && d < gpus, "cuda tp: device {} is not one of the {} visible", d, gpus);
  int distinct = gpus;
  if (!opt.devices.empty()) {
    std::vector<int> d = opt.devices;
    std::sort(d.begin(), d.end());
    distinct = int(std::unique(d.begin(), d.end()) - d.begin());
  }
  const bool own_gpu = distinct >= opt.tp;
  if (opt.comm == "nccl") {
    M3_CHECK(nccl_available(), "cuda tp: --tp-comm nccl, but this build has no NCCL");
    M3_CHECK(own_gpu, "cuda tp: NCCL needs one GPU per rank ({} ranks, {} GPUs); --tp-comm host runs the ranks on "
             "shared GPUs through the host", opt.tp, distinct);
    return "nccl";
  }
  if (opt.comm == "host") return "host-staged";
  if (own_gpu && nccl_available()) return "nccl";
  if (why)
    *why = own_gpu ? "this build has no NCCL"
                   : fmt::format("{} ranks share {} GPU(s): collectives go through the host, without CUDA graphs",
                                 opt.tp, distinct);
  return "host-staged";
}

std::unique_ptr<Backend> make_cuda_tp_backend(const RankWeightsLoader& load, const CudaTpOptions& opt) {
  return std::make_unique<CudaTpBackend>(load, opt);
}

}  // namespace m3::native
