// The tensor-parallel ops (native/collective.h).
#include <algorithm>

#include "kernels/rank_sum.cuh"
#include "native/collective.h"
#include "native/cuda_check.h"
#include "native/launch.cuh"

namespace m3::native {

RankReduceParams make_rank_reduce_params(DeviceComm* comm, float* data, int64_t n, float* gather, int64_t chunk) {
  M3_CHECK(comm && data && gather, "rank reduce: missing communicator or buffers");
  M3_CHECK(n >= 0 && n % 4 == 0 && chunk > 0 && chunk % 4 == 0,
           "rank reduce: {} elements in chunks of {} (both multiples of 4, chunk > 0)", n, chunk);
  return RankReduceParams{comm, data, n, gather, chunk};
}

VocabGatherParams make_vocab_gather_params(DeviceComm* comm, const float* local, int rows, int64_t cols, float* gather,
                                           float* out, int64_t ld_out) {
  M3_CHECK(comm && local && gather && out, "vocab gather: missing communicator or buffers");
  M3_CHECK(rows >= 0 && cols > 0 && ld_out >= cols * comm->size(),
           "vocab gather: {} rows of {} columns on {} ranks into rows of {}", rows, cols, comm->size(), ld_out);
  return VocabGatherParams{comm, local, rows, cols, gather, out, ld_out};
}

void launch(const RankReduceParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  const int N = p.comm->size();
  for (int64_t off = 0; off < p.n; off += p.chunk) {
    const int64_t c = std::min(p.chunk, p.n - off);
    p.comm->all_gather(p.data + off, p.gather, size_t(c) * 4, stream);
    const kernels::RankSumParams s{p.gather, c, N, p.data + off, c};
    launch_op<kernels::RankSumOp>(s, kernels::rank_sum_shape(s), stream, "rank_sum", opt);
  }
}

void launch(const VocabGatherParams& p, cudaStream_t stream, const LaunchOptions&) {
  if (p.rows == 0) return;
  const int N = p.comm->size();
  const size_t slice = size_t(p.rows) * size_t(p.cols);
  p.comm->all_gather(p.local, p.gather, slice * 4, stream);
  for (int r = 0; r < N; ++r)
    M3_CUDA_CHECK(cudaMemcpy2DAsync(p.out + int64_t(r) * p.cols, size_t(p.ld_out) * 4, p.gather + size_t(r) * slice,
                                    size_t(p.cols) * 4, size_t(p.cols) * 4, size_t(p.rows), cudaMemcpyDeviceToDevice,
                                    stream));
}

}  // namespace m3::native
