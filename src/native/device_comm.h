// Collectives between the tensor-parallel ranks of the native GPU path (issue 14; docs/tensor-parallel.md):
// what the forward's collective ops (native/collective.h) call. Two engines behind one interface:
//   - NCCL (native/nccl_comm.cpp): one GPU per rank, the calls enqueued on the step's stream, so
//     they are captured into the decode buckets' CUDA graphs like any launch;
//   - host-staged (over a runtime Communicator, runtime/communicator.h): the rank's bytes copied to
//     the host, exchanged there, copied back. It synchronizes the stream, so a backend using it runs
//     without graphs; it lets several ranks share one GPU (tests; machines with fewer GPUs than ranks).
// The only collective is an all-gather: the forward adds the gathered partial sums itself, in rank
// order, elementwise (kernels/rank_sum.cuh), so a row's bits never depend on the message size, the
// batch or the engine's algorithm, and every rank holds the same bits.
// Contract (as runtime/communicator.h): every rank calls the same collectives in the same order with
// the same sizes.
// Plain C++ header (no CUDA include).
#pragma once
#include <cstddef>
#include <memory>
#include <string>

typedef struct CUstream_st* cudaStream_t;

namespace m3 {
class Communicator;
}

namespace m3::native {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "nccl", "host-staged"
  // Whether the calls may be captured into a CUDA graph (they never synchronize the stream).
  virtual bool capturable() const = 0;
  // Every rank's in[0, bytes) (device memory) into out[r * bytes, (r + 1) * bytes) (device memory)
  // on every rank, ordered on `stream` after the work already enqueued there.
  virtual void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) = 0;
  // Makes this rank's pending and later collectives fail instead of waiting for a peer that will
  // not come (a rank that failed mid-step); callable from another thread. The group is unusable
  // afterwards.
  virtual void abort(const std::string& why) = 0;
};

// Over a host communicator: the group of its ranks, one GPU or several.
std::unique_ptr<DeviceComm> make_host_staged_comm(std::shared_ptr<Communicator> host);

// Whether this build has NCCL.
bool nccl_available();
// Rank bootstrap.rank() of bootstrap.size() over NCCL on the current CUDA device; rank 0's NCCL id
// reaches the others through `bootstrap` (every rank calls this at the same time: it returns when
// the whole group has joined). Throws naming NCCL's error (or this build's lack of NCCL).
std::unique_ptr<DeviceComm> make_nccl_comm(Communicator& bootstrap);

}  // namespace m3::native
