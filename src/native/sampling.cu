// Launchers of the device sampler (kernels/sampling.cuh): greedy jobs in one launch, stochastic
// jobs in groups of max_rows (prep -> one CUB device-wide radix sort of the group's packed keys ->
// pick).
#include <cub/device/device_radix_sort.cuh>

#include <cmath>

#include "kernels/sampling.cuh"
#include "native/cuda_check.h"
#include "native/launch.cuh"
#include "native/sampling.h"

namespace m3::native {

namespace {

using kernels::kSampleThreads;

constexpr int kGreedySmem = int(sizeof(typename kernels::SampleGreedyReduce::TempStorage));
constexpr int kPickSmem = int(sizeof(kernels::SamplePickStorage));

int bits_for(int v) {  // bits to hold 0 .. v - 1
  int b = 0;
  while ((int64_t(1) << b) < v) ++b;
  return b;
}

}  // namespace

DeviceSampler::DeviceSampler(int max_rows, int vocab) : max_rows_(max_rows), vocab_(vocab) {
  M3_CHECK(max_rows >= 1 && vocab >= 1 && int64_t(max_rows) * vocab <= INT32_MAX,
           "device sampler: {} rows x vocab {} unsupported (rows >= 1, rows * vocab < 2^31)", max_rows, vocab);
  id_bits_ = std::max(1, bits_for(vocab));
  M3_CHECK(32 + id_bits_ + bits_for(max_rows) <= 64, "device sampler: vocab {} x {} rows do not fit 64-bit keys", vocab,
           max_rows);
  const size_t n = size_t(max_rows) * size_t(vocab);
  try {
    M3_CUDA_CHECK(cudaMalloc(&keys_[0], n * 8));
    M3_CUDA_CHECK(cudaMalloc(&keys_[1], n * 8));
    M3_CUDA_CHECK(cudaMalloc(&nan_first_, size_t(max_rows) * 4));
    cub::DoubleBuffer<uint64_t> db(keys_[0], keys_[1]);
    M3_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(nullptr, cub_bytes_, db, int(n), 0,
                                                           32 + id_bits_ + bits_for(max_rows)));
    M3_CUDA_CHECK(cudaMalloc(&cub_tmp_, std::max<size_t>(cub_bytes_, 16)));
  } catch (...) {
    release();
    throw;
  }
  bytes_ = 2 * n * 8 + size_t(max_rows) * 4 + cub_bytes_;
}

DeviceSampler::~DeviceSampler() { release(); }

void DeviceSampler::release() {
  cudaFree(keys_[0]);
  cudaFree(keys_[1]);
  cudaFree(nan_first_);
  cudaFree(cub_tmp_);
  cudaFree(jobs_);
  cudaFree(lists_);
  keys_[0] = keys_[1] = nullptr;
  nan_first_ = lists_ = nullptr;
  cub_tmp_ = nullptr;
  jobs_ = nullptr;
}

void DeviceSampler::ensure_jobs(size_t n) {
  if (n <= jobs_cap_) return;
  cudaFree(jobs_);
  cudaFree(lists_);
  jobs_ = nullptr;
  lists_ = nullptr;
  jobs_cap_ = 0;
  const size_t cap = std::max<size_t>(n, 64);
  M3_CUDA_CHECK(cudaMalloc(&jobs_, cap * sizeof(kernels::SampleJob)));
  M3_CUDA_CHECK(cudaMalloc(&lists_, cap * 4));
  jobs_cap_ = cap;
}

void DeviceSampler::sample(const float* logits, int64_t ld, std::span<const kernels::SampleJob> jobs, int32_t* tokens,
                           int32_t* status, cudaStream_t stream) {
  if (jobs.empty()) return;
  M3_CHECK(logits && tokens && status && ld >= vocab_, "device sampler: bad arguments (ld {} < vocab {}?)", ld, vocab_);
  std::vector<int32_t> lists;  // greedy jobs, then stochastic jobs
  lists.reserve(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto& q = jobs[j];
    M3_CHECK(std::isfinite(q.temperature) && q.temperature >= 0,
             "device sampler: job {}: temperature must be finite and >= 0, got {}", j, q.temperature);
    M3_CHECK(q.top_k >= 0, "device sampler: job {}: top_k must be >= 0 (0 = off), got {}", j, q.top_k);
    M3_CHECK(q.top_p > 0 && q.top_p <= 1, "device sampler: job {}: top_p must be in (0, 1], got {}", j, q.top_p);
    M3_CHECK(q.row >= 0, "device sampler: job {}: row {} < 0", j, q.row);
    if (q.temperature == 0) lists.push_back(int32_t(j));
  }
  const int ngreedy = int(lists.size());
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].temperature != 0) lists.push_back(int32_t(j));
  ensure_jobs(jobs.size());
  M3_CUDA_CHECK(cudaMemcpyAsync(jobs_, jobs.data(), jobs.size() * sizeof(kernels::SampleJob), cudaMemcpyHostToDevice,
                                stream));
  M3_CUDA_CHECK(cudaMemcpyAsync(lists_, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice, stream));

  kernels::SampleParams p;
  p.logits = logits;
  p.ld = ld;
  p.vocab = vocab_;
  p.jobs = jobs_;
  p.tokens = tokens;
  p.status = status;
  p.nan_first = nan_first_;
  p.id_bits = id_bits_;
  if (ngreedy > 0) {
    p.list = lists_;
    launch_op<kernels::SampleGreedyOp>(p, kernels::WorkShape{ngreedy, kSampleThreads, kGreedySmem}, stream,
                                       "sample_greedy");
  }
  const int nst = int(jobs.size()) - ngreedy;
  for (int g0 = 0; g0 < nst; g0 += max_rows_) {
    const int G = std::min(max_rows_, nst - g0);
    p.list = lists_ + ngreedy + g0;
    p.keys = keys_[0];
    p.group = G;
    M3_CUDA_CHECK(cudaMemsetAsync(nan_first_, 0x7f, size_t(G) * 4, stream));  // 0x7f7f7f7f >= vocab: none
    launch_op<kernels::SamplePrepOp>(
        p, kernels::WorkShape{kernels::ceil_div(vocab_, kernels::kSamplePrepThreads) * G, kernels::kSamplePrepThreads, 0},
        stream, "sample_prep");
    cub::DoubleBuffer<uint64_t> db(keys_[0], keys_[1]);
    size_t bytes = cub_bytes_;
    M3_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(cub_tmp_, bytes, db, G * vocab_, 0,
                                                           32 + id_bits_ + bits_for(G), stream));
    p.sorted = db.Current();
    launch_op<kernels::SamplePickOp>(p, kernels::WorkShape{G, kSampleThreads, kPickSmem}, stream, "sample_pick");
  }
}

void check_sample_status(std::span<const int32_t> status, const std::vector<std::string>& what) {
  for (size_t j = 0; j < status.size(); ++j) {
    const std::string name = j < what.size() ? what[j] : "job " + std::to_string(j);
    M3_CHECK(status[j] != kernels::kSampleAllNegInf, "sampling: {}: every logit is -inf", name);
    M3_CHECK(status[j] <= 0, "sampling: {}: logit of token {} is NaN", name, status[j] - 1);
    M3_CHECK(status[j] == kernels::kSampleOk, "sampling: {}: unknown status {}", name, status[j]);
  }
}

}  // namespace m3::native
