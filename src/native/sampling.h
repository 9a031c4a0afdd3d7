// Sampling on the device (kernels/sampling.cuh): for J jobs over rows of fp32 logits [*][ld] on the
// device, one token id (int32) and one status (kernels/sampling_job.h) per job into device
// buffers. Greedy jobs: one block per job (argmax). Stochastic jobs, in groups of at most
// max_rows: packed keys (prep kernel), one CUB device-wide radix sort of the group's keys (the row
// in the top bits keeps rows apart), one block per job (pick).
//
// Storage: allocated once by the constructor for (max_rows, vocab): 2 x max_rows x vocab uint64
// keys plus CUB's temporary storage (32 rows at vocab 200064: 102 MB). sample() uploads the jobs
// with an asynchronous copy from host memory and launches the sort through CUB's host API: it is
// meant to run eagerly on a stream, outside CUDA graphs (CudaBackend launches it after a decode
// graph's replay).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/sampling_job.h"

namespace m3::native {

class DeviceSampler {
 public:
  DeviceSampler(int max_rows, int vocab);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  int vocab() const { return vocab_; }
  int max_rows() const { return max_rows_; }
  size_t device_bytes() const { return bytes_; }

  // Enqueues on `stream`: tokens[j], status[j] (device int32 [jobs.size()]) for each job over
  // logits (device, row r at logits + r * ld, ld >= vocab). Validates the jobs' parameters (throws
  // m3::Error naming the job and field). Asynchronous; the host span may be freed on return.
  void sample(const float* logits, int64_t ld, std::span<const kernels::SampleJob> jobs, int32_t* tokens,
              int32_t* status, cudaStream_t stream);

 private:
  void ensure_jobs(size_t n);
  void release();
  int max_rows_ = 0, vocab_ = 0, id_bits_ = 0;
  size_t bytes_ = 0;
  uint64_t* keys_[2] = {nullptr, nullptr};
  int32_t* nan_first_ = nullptr;  // [max_rows]
  void* cub_tmp_ = nullptr;
  size_t cub_bytes_ = 0;
  kernels::SampleJob* jobs_ = nullptr;  // device copy of the jobs
  int32_t* lists_ = nullptr;            // [cap]: greedy list, then stochastic list
  size_t jobs_cap_ = 0;
};

// Throws m3::Error for the first job whose status is not ok: "sampling: <what[j]>: logit of token
// N is NaN" or "...: every logit is -inf". status: host copy, what: one name per job (e.g. "row 3").
void check_sample_status(std::span<const int32_t> status, const std::vector<std::string>& what);

}  // namespace m3::native
