// The tokens a step samples on the device (SeqStep::sample; native/sampling.h): the jobs of the
// step in output-row order, launched over each lm_head group's logits as they are produced, then
// collected (with the NaN / all -inf checks naming the sequence).
#pragma once
#include <memory>
#include <vector>

#include "kernels/sampling_job.h"
#include "native/dev_buf.h"
#include "native/sampling.h"
#include "runtime/backend.h"

namespace m3::native {

class StepSamples {
 public:
  explicit StepSamples(int vocab) : vocab_(vocab) {}
  // The step's jobs from the batch (job row = the sequence's last output row of the step).
  // Returns whether any sequence samples.
  bool begin(const StepBatch& batch);
  bool empty() const { return jobs_.empty(); }
  // Launches the jobs whose output row lies in [g0, g0 + r) over logits (row g - g0).
  void launch_rows(const float* logits, int g0, int r, cudaStream_t stream);
  // After the step's launches: the tokens per sequence (-1 where none was requested).
  std::vector<int32_t> collect(const StepBatch& batch, cudaStream_t stream);

 private:
  int vocab_;
  std::unique_ptr<DeviceSampler> sampler_;  // created by the first step that samples
  std::vector<kernels::SampleJob> jobs_;    // this step's, in output-row order
  DevBuf tokens_, status_;                  // int32 per job
};

}  // namespace m3::native
