// StepSamples (native/step_samples.h).
#include "native/step_samples.h"

#include <fmt/format.h>

#include <algorithm>

#include "native/cuda_check.h"

namespace m3::native {

bool StepSamples::begin(const StepBatch& batch) {
  jobs_.clear();
  int rows = 0;
  for (const SeqStep& s : batch.seqs) {
    rows += s.all_logits ? int(s.tokens.size()) : 1;
    if (!s.sample) continue;
    kernels::SampleJob j;
    j.row = rows - 1;  // global output row until launched (then the row in the logits buffer)
    j.temperature = s.sample->params.temperature;
    j.top_k = s.sample->params.top_k;
    j.top_p = s.sample->params.top_p;
    j.seed = s.sample->state.seed;
    j.draw = s.sample->state.draws;
    jobs_.push_back(j);
  }
  if (jobs_.empty()) return false;
  if (!sampler_) sampler_ = std::make_unique<DeviceSampler>(32, vocab_);  // 32 stochastic rows per sort group
  const size_t need = jobs_.size() * 4;
  if (tokens_.bytes() < need) {
    tokens_ = DevBuf(std::max<size_t>(need, 256));
    status_ = DevBuf(std::max<size_t>(need, 256));
  }
  return true;
}

void StepSamples::launch_rows(const float* logits, int g0, int r, cudaStream_t stream) {
  size_t b = 0;
  while (b < jobs_.size() && jobs_[b].row < g0) ++b;
  size_t e = b;
  while (e < jobs_.size() && jobs_[e].row < g0 + r) ++e;
  if (b == e) return;
  std::vector<kernels::SampleJob> run(jobs_.begin() + ptrdiff_t(b), jobs_.begin() + ptrdiff_t(e));
  for (auto& j : run) j.row -= g0;
  sampler_->sample(logits, vocab_, run, tokens_.get<int32_t>() + b, status_.get<int32_t>() + b, stream);
}

std::vector<int32_t> StepSamples::collect(const StepBatch& batch, cudaStream_t stream) {
  const size_t J = jobs_.size();
  std::vector<int32_t> tok(J), st(J);
  M3_CUDA_CHECK(cudaMemcpyAsync(tok.data(), tokens_.get(), J * 4, cudaMemcpyDeviceToHost, stream));
  M3_CUDA_CHECK(cudaMemcpyAsync(st.data(), status_.get(), J * 4, cudaMemcpyDeviceToHost, stream));
  M3_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<int32_t> out(batch.seqs.size(), -1);
  std::vector<std::string> names;
  size_t j = 0;
  for (size_t k = 0; k < batch.seqs.size(); ++k)
    if (batch.seqs[k].sample) {
      names.push_back(fmt::format("seqs[{}]", k));
      out[k] = tok[j++];
    }
  check_sample_status(st, names);
  return out;
}

}  // namespace m3::native
