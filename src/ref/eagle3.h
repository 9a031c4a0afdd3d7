// The EAGLE3 draft model on the CPU, in fp32 with the reference's fixed-order sums (ref/linear.h),
// a network of the drafter that runs it beside a target (runtime/eagle3_drafter.h). The math, per draft position p
// with the token t at p + 1 and the hidden h (fc(aux) from the target, or the draft's own pre-norm
// output of position p - 1 while drafting):
//   e = N(embed[t]; input_layernorm),  r = h, g = N(h; hidden_norm)   (norm_before_residual: r = g)
//   a = [e, g];  q, k, v = Wq a, Wk a, Wv a;  RoPE (Llama: rotate-half, llama3 scaling if given)
//   o = causal softmax attention over the draft's own K/V of positions 0 .. p (GQA)
//   r = r + Wo o;  m = Wdown(silu(Wgate N(r; post_attention_layernorm)) * Wup N(...));  r = r + m
//   pre-norm output r;  logits = lm_head N(r; norm), draft id i -> target id i + d2t[i]
// with N(x; w) = x / sqrt(mean(x^2) + eps) * w (Llama's RMS norm). model/eagle3_spec.h has the shape.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "model/eagle3_weights.h"
#include "runtime/eagle3_drafter.h"

namespace m3::ref {

// One sequence's draft K/V cache (fp32, [position][kv_dim]) and what its last position left.
struct Eagle3Cache {
  std::vector<float> k, v;
  int len = 0;  // positions whose K/V came from observed (target-kept) tokens
};

class Eagle3Model final : public Eagle3Net {
 public:
  Eagle3Model(Eagle3Spec spec, Eagle3Weights w, int threads = 0);
  const Eagle3Spec& spec() const override { return s_; }
  const Eagle3Weights& weights() const { return w_; }
  // What a row's hidden input is: the target's aux states (fc_in floats, through fc) or the draft's
  // own pre-norm output of the row before (hidden floats).
  enum class Input : uint8_t { TargetAux, DraftPrenorm };
  // n consecutive rows at positions start .. start + n - 1 of `cache` (its K/V written there;
  // attention over positions 0 .. p of each row): tokens[i] the row's token, hidden n rows of
  // `in`. Returns the rows' pre-norm outputs (n x hidden) and the last row's logits over the target
  // vocabulary (d2t applied; -inf where no draft id maps) in last_logits when given.
  std::vector<float> forward(Eagle3Cache& cache, int32_t start, std::span<const int32_t> tokens, const float* hidden,
                             Input in, std::vector<float>* last_logits);

  // Eagle3Net: forward() over a sequence's Eagle3Cache, greedy over its last logits.
  std::unique_ptr<Eagle3SeqState> new_sequence() override;
  int32_t observe(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux) override;
  int32_t draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) override;

 private:
  Eagle3Spec s_;
  Eagle3Weights w_;
  ThreadPool pool_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

using m3::Eagle3Drafter;

// The drafter for `draft_dir` beside the target checkpoint `target_dir` (its spec `target`): the
// draft's config and tensors, the target's embedding / lm_head where the draft shares them.
std::shared_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& draft_dir,
                                                   const std::filesystem::path& target_dir, const ModelSpec& target,
                                                   int threads = 0);

}  // namespace m3::ref
