// A model that proposes draft tokens from the target's own hidden states (EAGLE3: ref/eagle3.h),
// kept per sequence beside the target's cache. The caller (runtime/generate, the scheduler) feeds
// it what each target step kept and asks it for drafts before a verify step:
//   observe(seq, start, next, aux): the target kept positions start .. start + n - 1 of `seq`; aux
//     holds their auxiliary hidden states (StepOutput::aux rows, aux_layers() order) and next[i]
//     is the token at position start + i + 1 (the last one: the token the target chose after
//     them). A drafter may overwrite what it held for positions >= start; start must not be past
//     what it has seen (0 starts the sequence again).
//   propose(seq, k): up to k tokens continuing the sequence after the last `next` it observed.
//   release(seq): forget the sequence (finished, failed or preempted).
// The drafts never change the output: greedy verification keeps a draft only when it equals the
// target's own choice (runtime/speculative.h).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace m3 {

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Target layers whose entering hidden states observe() reads (StepBatch::aux_layers).
  virtual const std::vector<int>& aux_layers() const = 0;
  virtual void observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) = 0;
  virtual std::vector<int32_t> propose(uint64_t seq, int k) = 0;
  virtual void release(uint64_t seq) = 0;
};

}  // namespace m3
