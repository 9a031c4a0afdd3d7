// The EAGLE3 draft network (runtime/eagle3_drafter.h) on the current GPU, the math of ref/eagle3.h:
// native's kernels for the linears (BF16 weights on the tensor-core kernel, fp32 activations split
// into bf16 hi + lo, fp32 sums) and the RMS norms (Llama's scale w), kernels/eagle3_draft.cuh for
// RoPE with the cache write, the causal attention (fp32, online softmax) and the SiLU gate.
//   - Weights, the embedding included: uploaded once in BF16 (a BF16 checkpoint's values exactly;
//     F32 / F16 ones rounded to nearest even), in slices, so the host holds no second copy.
//   - Per sequence: a device K/V cache of fp32 rows, grown by doubling, and the pre-norm rows the
//     next draft reads (the last observed row's and the last draft's), kept on the device.
//   - A call runs its rows in chunks of at most max_rows (a long prompt's observe needs no large
//     scratch) on the net's own stream; the greedy draft is picked on the device (eagle3_greedy's
//     rule) and a chain of drafts (draft_chain) feeds each row's id to the next row's embedding
//     there: one host round trip for the whole chain (its ids), none for the logits.
// Not bitwise the CPU reference: the same sums in other orders, float norms and softmax (the CPU's
// are double); tests/gpu/test_eagle3.cpp bounds the difference and checks the drafts.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/eagle3_weights.h"
#include "runtime/eagle3_drafter.h"

namespace m3::native {

struct CudaEagle3Seq;  // a sequence's device state (eagle3_net.cu)

// eagle3_greedy on the device (the net's pick): *out = the target id of the largest of n logits
// (device pointers; d2t may be null). Enqueued on `stream`.
void eagle3_greedy_device(const float* logits, int n, const int32_t* d2t, int32_t* out, cudaStream_t stream);

class CudaEagle3Net final : public Eagle3Net {
 public:
  // Throws (naming the shape) when the draft's heads do not fit the kernels (head_dim even, at most
  // 256; num_heads a multiple of num_kv_heads) or device memory runs out.
  CudaEagle3Net(Eagle3Spec spec, Eagle3Weights w, int max_rows = 64);
  ~CudaEagle3Net() override;
  const Eagle3Spec& spec() const override { return s_; }
  std::unique_ptr<Eagle3SeqState> new_sequence() override;
  int32_t observe(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux) override;
  int32_t draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) override;
  void draft_chain(Eagle3SeqState& s, int32_t pos, int32_t token, int n, int32_t* out) override;
  // The last row's draft logits (draft_vocab of them, before d2t) and a sequence's kept pre-norm
  // row (hidden floats), read back from the device (tests).
  std::vector<float> last_draft_logits() const;
  std::vector<float> last_prenorm(const Eagle3SeqState& s, bool observed) const;
  size_t device_bytes() const;
  // Device time by stage (events after each launch), summed over the calls since it was turned on
  // (bench): name -> microseconds, in first-seen order; calls counted.
  void set_profile(bool on);
  std::vector<std::pair<std::string, double>> profile() const;
  int profiled_calls() const;

 private:
  struct Impl;
  enum class Src { Aux, Observed, Drafted };
  // rows [0, m) of a chunk at positions pos0.. over embedding ids `ids` (device) and aux (Aux) or
  // the kept pre-norm row; with head, the last row's logits and greedy id into *id_out (device)
  void rows(CudaEagle3Seq& s, int pos0, int m, const int32_t* ids, const float* aux, Src src, bool head,
            int32_t* id_out);
  void mark(const char* stage);
  void finish();  // the call's sync (and its profile)
  void check_tokens(std::span<const int32_t> tokens, int32_t start) const;
  void reserve(CudaEagle3Seq& s, int need);
  void chain(CudaEagle3Seq& s, int32_t pos, int32_t token, int n, int32_t* out, bool from_observed);
  Eagle3Spec s_;
  std::unique_ptr<Impl> d_;
};

}  // namespace m3::native
