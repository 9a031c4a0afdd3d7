// The EAGLE3 draft network (runtime/eagle3_drafter.h) on the current GPU, the math of ref/eagle3.h:
// native's kernels for the linears (BF16 weights on the tensor-core kernel, fp32 activations split
// into bf16 hi + lo, fp32 sums) and the RMS norms (Llama's scale w), kernels/eagle3_draft.cuh for
// RoPE with the cache write, the causal attention (fp32, online softmax) and the SiLU gate.
//   - Weights: uploaded once in BF16 (a BF16 checkpoint's values exactly; F32 / F16 ones rounded to
//     nearest even); the embedding stays on the host (a call's rows gathered there, ~H floats a row).
//   - Per sequence: a device K/V cache of fp32 rows, grown by doubling, and the pre-norm rows the
//     next draft reads (the last observed row's and the last draft's), kept on the device.
//   - A call runs its rows in chunks of at most max_rows (a long prompt's observe needs no large
//     scratch) on the net's own stream, then reads back the last row's draft logits (draft_vocab
//     floats) and picks the greedy draft on the host (eagle3_greedy).
// Not bitwise the CPU reference: the same sums in other orders, float norms and softmax (the CPU's
// are double); tests/gpu/test_eagle3.cpp bounds the difference and checks the drafts.
#pragma once
#include <memory>
#include <vector>

#include "model/eagle3_weights.h"
#include "runtime/eagle3_drafter.h"

namespace m3::native {

class CudaEagle3Net final : public Eagle3Net {
 public:
  // Throws (naming the shape) when the draft's heads do not fit the kernels (head_dim even, at most
  // 256; num_heads a multiple of num_kv_heads) or device memory runs out.
  CudaEagle3Net(Eagle3Spec spec, Eagle3Weights w, int max_rows = 64);  // keeps w.embed only
  ~CudaEagle3Net() override;
  const Eagle3Spec& spec() const override { return s_; }
  std::unique_ptr<Eagle3SeqState> new_sequence() override;
  int32_t observe(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux) override;
  int32_t draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) override;
  // The last call's draft logits (draft_vocab of them, before d2t) and its last row's pre-norm
  // output (hidden floats), read back from the device (tests).
  const std::vector<float>& last_draft_logits() const { return logits_; }
  std::vector<float> last_prenorm(const Eagle3SeqState& s, bool observed) const;
  size_t device_bytes() const;

 private:
  struct Impl;
  enum class Src { Aux, Observed, Drafted };
  int32_t run(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux, Src src);
  Eagle3Spec s_;
  std::unique_ptr<Impl> d_;
  std::vector<float> logits_;
};

}  // namespace m3::native
