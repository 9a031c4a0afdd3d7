// Tensor parallelism of the native GPU path inside one process (issue 14; docs/tensor-parallel.md):
// N rank backends (native/cuda_backend.h), each over its own shard of the prepared weights and its
// own cache (its KV heads), on its own thread and CUDA device, joined by a DeviceComm
// (native/device_comm.h: NCCL with one GPU per rank, or host-staged collectives, which also let
// the ranks share GPUs). Every rank runs every step; rank 0's output is the step's (every rank
// computes the same logits and draws the same samples). A step that fails on every rank alike (a
// malformed batch: the ranks validate it the same way) leaves the group usable; a rank that fails
// alone fails the step within ~10 s on every rank (its peers' collectives are aborted if they still
// wait) and breaks the group: later steps throw naming the first failure.
// Plain C++ header; built only with CUDA.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "native/cuda_backend.h"

namespace m3::native {

class PreparedWeights;

struct CudaTpOptions {
  int tp = 2;
  std::string comm = "auto";  // "nccl", "host" (host-staged) or "auto" (NCCL when every rank has its own GPU)
  std::vector<int> devices;   // the GPU of each rank (empty: rank r on GPU r mod the visible GPUs)
  CudaBackendOptions backend; // every rank's (its comm is set here)
  // Fault injection (tests): rank fault_rank throws at the start of step fault_step (0-based), alone,
  // while the others go into the step's collectives.
  int fault_rank = -1, fault_step = -1;
};

// load(rank): rank `rank`'s shard of the prepared weights (PrepareOptions tp_rank / tp_size),
// called on the rank's thread with its device current (so the arena lands there).
using RankWeightsLoader = std::function<std::shared_ptr<const PreparedWeights>(int rank)>;

// Throws naming the problem (a bad --tp, NCCL asked with fewer GPUs than ranks or without NCCL in
// the build, a rank's load failure naming the rank).
std::unique_ptr<Backend> make_cuda_tp_backend(const RankWeightsLoader& load, const CudaTpOptions& opt);

// Which collectives make_cuda_tp_backend picks for opt ("nccl" or "host-staged") and why (a note).
std::string cuda_tp_comm_choice(const CudaTpOptions& opt, std::string* why = nullptr);

}  // namespace m3::native
