// Rank 0 leads, the other ranks follow (runtime/tp_leader.h).
#include "runtime/tp_leader.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/check.h"

namespace m3 {

namespace {

constexpr uint32_t kMagic = 0x4253334du;  // "M3SB"
constexpr uint32_t kVersion = 1;

enum class Kind : uint32_t { Step = 1, Idle = 2, Stop = 3 };
constexpr uint32_t kFlagTrace = 1, kFlagRecordCache = 2;

struct Header {
  uint32_t kind = 0;
  uint32_t flags = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 16);

class Writer {
 public:
  template <class T>
  void put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void put_ints(const std::vector<int32_t>& v) {
    put(uint32_t(v.size()));
    const size_t at = out.size();
    out.resize(at + v.size() * sizeof(int32_t));
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(int32_t));
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  template <class T>
  T get(const char* what) {
    M3_CHECK(n_ - at_ >= sizeof(T), "tp step message: truncated at {} (byte {} of {})", what, at_, n_);
    T v;
    std::memcpy(&v, d_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::vector<int32_t> get_ints(const char* what) {
    const uint32_t k = get<uint32_t>(what);
    M3_CHECK((n_ - at_) / sizeof(int32_t) >= k, "tp step message: {} says {} values, {} bytes are left", what, k,
             n_ - at_);
    std::vector<int32_t> v(k);
    if (k) std::memcpy(v.data(), d_ + at_, size_t(k) * sizeof(int32_t));
    at_ += size_t(k) * sizeof(int32_t);
    return v;
  }
  size_t left() const { return n_ - at_; }

 private:
  const uint8_t* d_;
  size_t n_, at_ = 0;
};

void send(Communicator& c, Kind kind, uint32_t flags, const std::vector<uint8_t>& payload) {
  Header h{uint32_t(kind), flags, uint64_t(payload.size())};
  c.broadcast(&h, sizeof h, 0);
  if (!payload.empty()) c.broadcast(const_cast<uint8_t*>(payload.data()), payload.size(), 0);
}

// A follower's longest wait for rank 0's next message once it has spoken (heartbeats: 2 s).
constexpr std::chrono::milliseconds kLeaderSilence{10000};

class LeaderBackend final : public Backend {
 public:
  LeaderBackend(std::unique_ptr<Backend> rank0, std::shared_ptr<Communicator> comm, LeaderOptions opt)
      : rank0_(std::move(rank0)), comm_(std::move(comm)), opt_(opt) {
    M3_CHECK(rank0_ && comm_, "tp leader: no backend or no communicator");
    M3_CHECK(comm_->rank() == 0, "tp leader: rank {} of {} cannot lead (rank 0 does)", comm_->rank(), comm_->size());
    last_ = std::chrono::steady_clock::now();
    if (comm_->size() > 1 && opt_.heartbeat.count() > 0) beat_ = std::thread([this] { heartbeat(); });
  }
  ~LeaderBackend() override {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    if (beat_.joinable()) beat_.join();
    if (comm_->size() > 1 && broken_.empty()) {
      try {
        send(*comm_, Kind::Stop, 0, {});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "note: tp leader: the followers were not told to stop: %s\n", e.what());
      }
    }
    rank0_.reset();  // before the communicator (its collectives live in it)
  }

  std::string name() const override { return rank0_->name(); }
  const ModelSpec& spec() const override { return rank0_->spec(); }
  int cache_block_size() const override { return rank0_->cache_block_size(); }
  int num_cache_blocks() const override { return rank0_->num_cache_blocks(); }
  bool returns_aux() const override { return rank0_->returns_aux(); }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    std::lock_guard<std::mutex> lk(m_);
    M3_CHECK(broken_.empty(), "tp leader: the rank group is broken: {}", broken_);
    if (comm_->size() > 1) {
      const uint32_t flags = (trace ? kFlagTrace : 0) | (trace && trace->record_cache ? kFlagRecordCache : 0);
      try {
        send(*comm_, Kind::Step, flags, encode_step(batch));
      } catch (const std::exception& e) {
        broken_ = e.what();
        throw;
      }
      last_ = std::chrono::steady_clock::now();
    }
    return rank0_->step(batch, trace);
  }

 private:
  void heartbeat() {
    std::unique_lock<std::mutex> lk(m_);
    while (!quit_) {
      const auto due = last_ + opt_.heartbeat;
      if (std::chrono::steady_clock::now() >= due) {
        if (!broken_.empty()) return;
        try {
          send(*comm_, Kind::Idle, 0, {});
        } catch (const std::exception& e) {
          broken_ = e.what();
          std::fprintf(stderr, "error: tp leader: heartbeat to the followers failed: %s\n", e.what());
          return;
        }
        last_ = std::chrono::steady_clock::now();
        continue;
      }
      cv_.wait_until(lk, due, [&] { return quit_; });
    }
  }

  std::unique_ptr<Backend> rank0_;
  std::shared_ptr<Communicator> comm_;
  LeaderOptions opt_;
  std::mutex m_;  // one message (and the step's collectives) at a time
  std::condition_variable cv_;
  bool quit_ = false;
  std::string broken_;
  std::chrono::steady_clock::time_point last_;
  std::thread beat_;
};

}  // namespace

std::vector<uint8_t> encode_step(const StepBatch& b) {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(uint32_t(b.seqs.size()));
  for (const SeqStep& s : b.seqs) {
    w.put(s.start_pos);
    w.put_ints(s.tokens);
    w.put_ints(s.block_table);
    const uint8_t flags = uint8_t((s.all_logits ? 1 : 0) | (s.want_logits ? 2 : 0) | (s.want_aux ? 4 : 0) |
                                  (s.sample ? 8 : 0));
    w.put(flags);
    if (s.sample) {
      w.put(s.sample->params.temperature);
      w.put(int32_t(s.sample->params.top_k));
      w.put(s.sample->params.top_p);
      w.put(s.sample->params.seed);
      w.put(s.sample->state.seed);
      w.put(s.sample->state.draws);
    }
  }
  w.put_ints(std::vector<int32_t>(b.aux_layers.begin(), b.aux_layers.end()));
  return std::move(w.out);
}

StepBatch decode_step(const uint8_t* data, size_t bytes) {
  Reader r(data, bytes);
  const uint32_t magic = r.get<uint32_t>("magic"), version = r.get<uint32_t>("version");
  M3_CHECK(magic == kMagic, "tp step message: not a step (magic {:#x})", magic);
  M3_CHECK(version == kVersion, "tp step message: version {}, this build reads {} (every rank must run the same "
           "build)", version, kVersion);
  const uint32_t n = r.get<uint32_t>("sequence count");
  M3_CHECK(n <= r.left(), "tp step message: {} sequences in {} bytes", n, r.left());
  StepBatch b;
  b.seqs.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    SeqStep& s = b.seqs[i];
    s.start_pos = r.get<int32_t>("start_pos");
    s.tokens = r.get_ints("tokens");
    s.block_table = r.get_ints("block_table");
    const uint8_t flags = r.get<uint8_t>("flags");
    M3_CHECK(flags < 16, "tp step message: sequence {} has unknown flags {:#x}", i, flags);
    s.all_logits = flags & 1;
    s.want_logits = flags & 2;
    s.want_aux = flags & 4;
    if (flags & 8) {
      SamplingRequest q;
      q.params.temperature = r.get<float>("temperature");
      q.params.top_k = r.get<int32_t>("top_k");
      q.params.top_p = r.get<float>("top_p");
      q.params.seed = r.get<uint64_t>("seed");
      q.state.seed = r.get<uint64_t>("state seed");
      q.state.draws = r.get<uint64_t>("state draws");
      s.sample = q;
    }
  }
  const std::vector<int32_t> aux = r.get_ints("aux_layers");
  b.aux_layers.assign(aux.begin(), aux.end());
  M3_CHECK(r.left() == 0, "tp step message: {} bytes left over", r.left());
  return b;
}

std::unique_ptr<Backend> make_tp_leader(std::unique_ptr<Backend> rank0, std::shared_ptr<Communicator> comm,
                                        LeaderOptions opt) {
  return std::make_unique<LeaderBackend>(std::move(rank0), std::move(comm), opt);
}

int64_t follow_tp_leader(Backend& rank, Communicator& comm) {
  M3_CHECK(comm.rank() > 0, "tp follower: rank 0 leads, it does not follow");
  int64_t steps = 0;
  std::vector<uint8_t> payload;
  bool heard = false;
  for (;;) {
    Header h;
    // once rank 0 has spoken, it speaks at least every heartbeat between steps: a silence of
    // kLeaderSilence means it hangs (or died), and this rank ends the job naming it. (Before its
    // first message rank 0 may still be loading: the engine's own limit.)
    if (heard)
      comm.set_wait_limit(kLeaderSilence, fmt::format("rank 0 sent no step and no heartbeat for {} s: it hangs or "
                                                      "died", kLeaderSilence.count() / 1000));
    comm.broadcast(&h, sizeof h, 0);
    comm.set_wait_limit(std::chrono::milliseconds(0), "");
    heard = true;
    M3_CHECK(h.kind >= uint32_t(Kind::Step) && h.kind <= uint32_t(Kind::Stop),
             "tp follower (rank {}): unknown message kind {} from rank 0", comm.rank(), h.kind);
    if (h.kind == uint32_t(Kind::Stop)) return steps;
    if (h.kind == uint32_t(Kind::Idle)) continue;
    M3_CHECK(h.bytes > 0 && h.bytes < (uint64_t(1) << 34), "tp follower (rank {}): a step of {} bytes", comm.rank(),
             h.bytes);
    payload.resize(size_t(h.bytes));
    comm.broadcast(payload.data(), payload.size(), 0);
    const StepBatch batch = decode_step(payload.data(), payload.size());
    SelectionTrace trace;
    trace.record_cache = (h.flags & kFlagRecordCache) != 0;
    try {
      (void)rank.step(batch, (h.flags & kFlagTrace) ? &trace : nullptr);
    } catch (const Error& e) {
      // rank 0 runs the same step and fails it alike (a malformed batch); the group goes on
      std::fprintf(stderr, "note: tp follower (rank %d): step %lld failed: %s\n", comm.rank(), (long long)steps,
                   e.what());
    }
    ++steps;
  }
}

}  // namespace m3
