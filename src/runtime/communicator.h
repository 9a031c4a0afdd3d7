// Collectives among the ranks of one tensor-parallel group, and the agreement protocol built on
// them (issue 14). One interface, several engines: an in-process group (ranks as threads: unit
// tests and single-process TP of the CPU reference) here; MPI and NCCL implementations plug in
// behind the same interface.
//
// Contracts every implementation keeps:
//   - Every rank calls the same collectives in the same order with the same sizes. A rank that
//     calls another collective, or the same one with another size, makes the call fail on EVERY
//     rank with an m3::Error naming the ranks and what each called (never a hang, never a silent
//     mix-up).
//   - all_reduce_sum adds the ranks' values in rank order (((r0 + r1) + r2) + ...), so results do
//     not depend on timing and every rank gets the same bits.
//   - A rank that leaves (its Communicator destroyed, or fail() called) makes every pending and
//     later collective of the others fail, naming it and why; a rank that does not arrive within
//     the group's timeout makes the others fail, naming every rank that did not arrive.
// Agreement (agree, check_same): every decision one rank could take alone (mono's create or
// refusal, a step's path and shape, close) is agreed before any rank acts on it; a single refusing
// rank turns every rank down, and each learns every rank's reasons.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0, n) on every rank becomes the sum over ranks, added in rank order.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // Rank root's data[0, bytes) into every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's in[0, bytes) into out[r * bytes, (r + 1) * bytes) on every rank.
  virtual void all_gather(const void* in, void* out, size_t bytes) = 0;
  // This rank leaves the group: the others' pending and later collectives fail naming it and why.
  virtual void fail(const std::string& why) = 0;
  // The longest this rank's collectives wait from now on, and what a wait past it means (said when
  // it fails); 0: the engine's own limit again. Engines whose limit is the group's (the in-process
  // one) keep it.
  virtual void set_wait_limit(std::chrono::milliseconds limit, const std::string& meaning) {
    (void)limit;
    (void)meaning;
  }
};

// One rank's verdict on a decision, and what all ranks said.
struct Verdict {
  bool ok = true;
  std::string reason;  // why not (or a note when ok)
};
struct Agreement {
  bool ok = true;                // every rank said ok
  std::vector<Verdict> ranks;    // by rank
  // "rank 1: <reason>; rank 3: <reason>" for the ranks that refused ("" when all accepted)
  std::string refusals() const;
};
// Every rank calls it with its own verdict; every rank gets the same Agreement.
Agreement agree(Communicator& c, const Verdict& mine);
// Every rank calls it with what it is about to act on (a step's shape, a decision encoded as
// bytes); returns when every rank holds the same bytes, else throws on every rank an m3::Error
// naming `what` and the ranks whose bytes differ from rank 0's.
void check_same(Communicator& c, const void* data, size_t bytes, std::string_view what);

// Whether this process was started by an MPI launcher (mpirun / mpiexec: Open MPI's, or a PMI
// one): each process is then one rank (runtime/mpi/mpi_communicator.h).
bool mpi_launched();

// A group of `size` ranks inside one process (ranks as threads). rank(r) hands out rank r's
// communicator (once per rank); collectives wait at most `timeout` for the other ranks.
class LocalGroup {
 public:
  explicit LocalGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int size() const;
  std::unique_ptr<Communicator> rank(int r);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace m3
