// The in-process group (ranks as threads) and the agreement helpers (runtime/communicator.h).
#include "runtime/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace m3 {

std::string Agreement::refusals() const {
  std::string out;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (!ranks[r].ok) out += fmt::format("{}rank {}: {}", out.empty() ? "" : "; ", r, ranks[r].reason);
  return out;
}

namespace {

// The helpers' collectives carry a header first: which helper and what it is about (64 bytes), so
// that a rank in agree() and another in check_same() (or check_same of another `what`) fail on
// every rank instead of reading each other's bytes.
void check_header(Communicator& c, std::string_view kind, std::string_view what) {
  constexpr size_t kHeader = 64;
  char mine[kHeader] = {};
  const std::string h = std::string(kind) + ":" + std::string(what);
  std::memcpy(mine, h.data(), std::min(h.size(), kHeader - 1));
  std::vector<char> all(kHeader * size_t(c.size()));
  c.all_gather(mine, all.data(), kHeader);
  std::string differ;
  for (int r = 1; r < c.size(); ++r)
    if (std::memcmp(all.data() + size_t(r) * kHeader, all.data(), kHeader) != 0)
      differ += fmt::format("; rank {} is in '{}'", r, std::string(all.data() + size_t(r) * kHeader));
  M3_CHECK(differ.empty(), "tensor-parallel group (rank {} of {}): ranks disagree on what they agree on: rank 0 is "
           "in '{}'{}", c.rank(), c.size(), std::string(all.data()), differ);
}

std::vector<uint8_t> gather_varlen(Communicator& c, const void* data, size_t bytes, std::vector<size_t>& sizes) {
  const int n = c.size();
  uint64_t mine = bytes;
  std::vector<uint64_t> all(static_cast<size_t>(n));
  c.all_gather(&mine, all.data(), sizeof mine);
  sizes.assign(all.begin(), all.end());
  const size_t width = size_t(*std::max_element(all.begin(), all.end()));
  std::vector<uint8_t> padded(width, 0), out(width * size_t(n));
  if (bytes) std::memcpy(padded.data(), data, bytes);
  c.all_gather(padded.data(), out.data(), width);
  return out;
}

}  // namespace

Agreement agree(Communicator& c, const Verdict& mine) {
  check_header(c, "agree", "");
  std::string enc(1, mine.ok ? '1' : '0');
  enc += mine.reason;
  std::vector<size_t> sizes;
  const std::vector<uint8_t> all = gather_varlen(c, enc.data(), enc.size(), sizes);
  const size_t width = sizes.empty() ? 0 : all.size() / sizes.size();
  Agreement a;
  for (size_t r = 0; r < sizes.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * width);
    Verdict v;
    v.ok = sizes[r] > 0 && p[0] == '1';
    v.reason = sizes[r] > 1 ? std::string(p + 1, sizes[r] - 1) : std::string();
    a.ok = a.ok && v.ok;
    a.ranks.push_back(std::move(v));
  }
  return a;
}

void check_same(Communicator& c, const void* data, size_t bytes, std::string_view what) {
  check_header(c, "check_same", what);
  std::vector<size_t> sizes;
  const std::vector<uint8_t> all = gather_varlen(c, data, bytes, sizes);
  const size_t width = sizes.empty() ? 0 : all.size() / sizes.size();
  std::string differ;
  for (size_t r = 1; r < sizes.size(); ++r) {
    const bool same = sizes[r] == sizes[0] && std::memcmp(all.data() + r * width, all.data(), sizes[0]) == 0;
    if (!same)
      differ += fmt::format("{}rank {}{}", differ.empty() ? "" : ", ", r,
                            sizes[r] == sizes[0] ? "" : fmt::format(" ({} bytes against {})", sizes[r], sizes[0]));
  }
  M3_CHECK(differ.empty(), "tensor-parallel group: {} differs between ranks: {} hold(s) another than rank 0 (every "
           "rank must act on the same {}; this rank is {} of {})", what, differ, what, c.rank(), c.size());
}

// ---------------------------------------------------------------------------------------------

struct LocalGroup::State {
  int size = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex m;
  std::condition_variable cv;
  // one collective at a time: every rank arrives (deposits), then every rank departs (reads)
  bool departing = false;
  int arrived = 0, departed = 0;
  uint64_t seq = 0;  // collectives completed
  std::vector<std::string> desc;
  std::vector<std::vector<uint8_t>> slot;
  std::vector<char> present, handed;
  std::string broken;  // why the group no longer works ("" while it does)

  // Every rank's contribution to this collective (after each checked `d`, the collective's name
  // and size, against every other rank's).
  std::vector<std::vector<uint8_t>> exchange(int r, const std::string& d, const void* data, size_t n) {
    std::unique_lock<std::mutex> lk(m);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto wait_until = [&](auto pred, const char* stage) {
      while (!pred()) {
        M3_CHECK(broken.empty(), "tensor-parallel group (rank {} of {}, collective #{} '{}'): {}", r, size, seq, d,
                 broken);
        if (cv.wait_until(lk, deadline) == std::cv_status::timeout && !pred()) {
          std::string missing;
          for (int i = 0; i < size; ++i)
            if (present[size_t(i)] == 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", i);
          broken = std::string(stage) == "arrive at"
                       ? fmt::format("rank(s) {} did not arrive at collective #{} '{}' within {} ms", missing, seq, d,
                                     timeout.count())
                       : fmt::format("collective #{} was not finished by every rank within {} ms", seq,
                                     timeout.count());
          cv.notify_all();
          M3_FAIL("tensor-parallel group (rank {} of {}): {}", r, size, broken);
        }
      }
    };
    wait_until([&] { return !departing || !broken.empty(); }, "finish");
    M3_CHECK(broken.empty(), "tensor-parallel group (rank {} of {}, collective #{} '{}'): {}", r, size, seq, d,
             broken);
    desc[size_t(r)] = d;
    slot[size_t(r)].assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
    present[size_t(r)] = 1;
    if (++arrived == size) {
      departing = true;
      cv.notify_all();
    }
    wait_until([&] { return departing; }, "arrive at");
    std::string mismatch;
    for (int i = 1; i < size; ++i)
      if (desc[size_t(i)] != desc[0]) mismatch += fmt::format("; rank {} called '{}'", i, desc[size_t(i)]);
    const std::string d0 = desc[0];
    const uint64_t at = seq;
    std::vector<std::vector<uint8_t>> out = slot;
    if (++departed == size) {
      departing = false;
      arrived = departed = 0;
      std::fill(present.begin(), present.end(), char(0));
      ++seq;
      cv.notify_all();
    }
    lk.unlock();
    M3_CHECK(mismatch.empty(), "tensor-parallel group (rank {} of {}): ranks called different collectives at #{}: "
             "rank 0 called '{}'{}", r, size, at, d0, mismatch);
    return out;
  }

  void fail(int r, const std::string& why) {
    std::lock_guard<std::mutex> lk(m);
    if (broken.empty()) broken = fmt::format("rank {} left the group: {}", r, why);
    cv.notify_all();
  }
};

namespace {

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroup::State> s, int r) : s_(std::move(s)), r_(r) {}
  ~LocalComm() override { s_->fail(r_, "its communicator was destroyed"); }
  int rank() const override { return r_; }
  int size() const override { return s_->size; }

  void all_reduce_sum(float* data, size_t n) override {
    const auto all = s_->exchange(r_, fmt::format("all_reduce_sum of {} floats", n), data, n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      float acc;
      std::memcpy(&acc, all[0].data() + i * 4, 4);
      for (size_t k = 1; k < all.size(); ++k) {
        float v;
        std::memcpy(&v, all[k].data() + i * 4, 4);
        acc = acc + v;
      }
      data[i] = acc;
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    // the root is part of the call: checked on every rank after the exchange, so a bad root fails
    // every rank at once (not only this one, leaving the others to time out)
    const auto all = s_->exchange(r_, fmt::format("broadcast of {} bytes from rank {}", bytes, root), data, bytes);
    M3_CHECK(root >= 0 && root < s_->size, "broadcast: root {} is not a rank of this group of {}", root, s_->size);
    if (bytes) std::memcpy(data, all[size_t(root)].data(), bytes);
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    const auto all = s_->exchange(r_, fmt::format("all_gather of {} bytes", bytes), in, bytes);
    for (size_t k = 0; k < all.size(); ++k)
      if (bytes) std::memcpy(static_cast<uint8_t*>(out) + k * bytes, all[k].data(), bytes);
  }
  void fail(const std::string& why) override { s_->fail(r_, why); }

 private:
  std::shared_ptr<LocalGroup::State> s_;
  int r_;
};

}  // namespace

bool mpi_launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

LocalGroup::LocalGroup(int size, std::chrono::milliseconds timeout) : state_(std::make_shared<State>()) {
  M3_CHECK(size >= 1 && size <= 1024, "tensor-parallel group: size {} (1 to 1024 ranks)", size);
  M3_CHECK(timeout.count() > 0 && timeout <= std::chrono::hours(24),
           "tensor-parallel group: timeout {} ms must be positive and at most a day", timeout.count());
  state_->size = size;
  state_->timeout = timeout;
  state_->desc.resize(size_t(size));
  state_->slot.resize(size_t(size));
  state_->present.assign(size_t(size), 0);
  state_->handed.assign(size_t(size), 0);
}
LocalGroup::~LocalGroup() = default;
int LocalGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> LocalGroup::rank(int r) {
  std::lock_guard<std::mutex> lk(state_->m);
  M3_CHECK(r >= 0 && r < state_->size, "tensor-parallel group: rank {} of a group of {}", r, state_->size);
  M3_CHECK(!state_->handed[size_t(r)], "tensor-parallel group: rank {}'s communicator was already handed out", r);
  state_->handed[size_t(r)] = 1;
  return std::make_unique<LocalComm>(state_, r);
}

}  // namespace m3
