// The forward's tensor-parallel ops (issue 14; docs/tensor-parallel.md), over a DeviceComm
// (native/device_comm.h):
//   rank reduce : data[0, n) = the sum over ranks of each rank's data, added in rank order
//                 (kernels/rank_sum.cuh) after an all-gather of the partials, in chunks of at most
//                 `chunk` floats a rank (the workspace); the all-reduce after the O projection and
//                 after the MLP / MoE, whose outputs are partial sums over this rank's heads / widths;
//   vocab gather: each rank's lm_head rows (its vocabulary slice, rank r: columns [r cols, (r+1) cols))
//                 gathered into full logits rows [rows][ld_out] on every rank.
// Their params name the communicator, so a plan holds them like any op (native/op_call.h).
#pragma once
#include <cstdint>

#include "native/device_comm.h"
#include "native/launch.h"

namespace m3::native {

struct RankReduceParams {
  DeviceComm* comm = nullptr;
  float* data = nullptr;    // [n]: this rank's partial sums in, the ranks' sum out
  int64_t n = 0;            // a multiple of 4
  float* gather = nullptr;  // [comm->size()][chunk] workspace
  int64_t chunk = 0;        // floats a rank per all-gather (a multiple of 4)
};

struct VocabGatherParams {
  DeviceComm* comm = nullptr;
  const float* local = nullptr;  // [rows][cols]: this rank's vocabulary columns of each row
  int rows = 0;
  int64_t cols = 0;
  float* gather = nullptr;       // [comm->size()][rows][cols] workspace
  float* out = nullptr;          // [rows][ld_out]
  int64_t ld_out = 0;            // >= comm->size() * cols
};

RankReduceParams make_rank_reduce_params(DeviceComm* comm, float* data, int64_t n, float* gather, int64_t chunk);
VocabGatherParams make_vocab_gather_params(DeviceComm* comm, const float* local, int rows, int64_t cols, float* gather,
                                           float* out, int64_t ld_out);
void launch(const RankReduceParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const VocabGatherParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

}  // namespace m3::native
