// The EAGLE3 draft model on the CPU, in fp32 with the reference's fixed-order sums (ref/linear.h),
// and the drafter that runs it beside a target (runtime/drafter.h). The math, per draft position p
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
#include <unordered_map>
#include <vector>

#include "core/parallel.h"
#include "model/eagle3_spec.h"
#include "model/weights.h"
#include "runtime/drafter.h"

namespace m3 {
class WeightSource;
}

namespace m3::ref {

struct Eagle3Weights {
  Mat fc;                                        // [hidden, fc_in]
  Vec input_norm, hidden_norm, post_norm, norm;  // [hidden]
  Mat wq, wk, wv;                                // [q_dim | kv_dim, 2 hidden]
  Mat wo;                                        // [hidden, q_dim]
  Mat gate, up, down;                            // [I, hidden], [I, hidden], [hidden, I]
  Mat embed;                                     // [vocab, hidden]: the draft's, else the target's
  Mat lm_head;                                   // [draft_vocab, hidden]: the draft's, else the target's
  std::vector<int32_t> d2t;                      // [draft_vocab]: target id = i + d2t[i]; empty: i
  bool own_embed = false, own_lm_head = false;
};

// The tensors of DIR/model.safetensors (or the shards of its index): midlayer.* (or layers.0.*,
// either with a model. prefix), fc, norm, optional embed_tokens, lm_head, d2t (t2d ignored), in
// BF16, F16 or F32. The embedding and lm_head the draft lacks come from `target` (its checkpoint's
// values), which must then be given. Errors name the tensor, its shape and what was expected.
Eagle3Weights load_eagle3_weights(const std::filesystem::path& dir, const Eagle3Spec& s, const WeightSource* target);

// One sequence's draft K/V cache (fp32, [position][kv_dim]) and what its last position left.
struct Eagle3Cache {
  std::vector<float> k, v;
  int len = 0;  // positions whose K/V came from observed (target-kept) tokens
};

class Eagle3Model {
 public:
  Eagle3Model(Eagle3Spec spec, Eagle3Weights w, int threads = 0);
  const Eagle3Spec& spec() const { return s_; }
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

 private:
  Eagle3Spec s_;
  Eagle3Weights w_;
  ThreadPool pool_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

// Greedy EAGLE3 drafts (the argmax of each draft row) for any number of sequences.
class Eagle3Drafter final : public Drafter {
 public:
  explicit Eagle3Drafter(std::shared_ptr<Eagle3Model> model) : m_(std::move(model)) {}
  std::string name() const override { return "eagle3"; }
  const std::vector<int>& aux_layers() const override { return m_->spec().aux_layers; }
  void observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) override;
  std::vector<int32_t> propose(uint64_t seq, int k) override;
  void release(uint64_t seq) override { seqs_.erase(seq); }
  size_t sequences() const { return seqs_.size(); }

 private:
  struct Seq {
    Eagle3Cache cache;
    std::vector<float> prenorm;  // the last observed row's pre-norm output
    int32_t first = -1;          // the last observed row's draft
  };
  std::shared_ptr<Eagle3Model> m_;
  std::unordered_map<uint64_t, Seq> seqs_;
};

// The drafter for `draft_dir` beside the target checkpoint `target_dir` (its spec `target`): the
// draft's config and tensors, the target's embedding / lm_head where the draft shares them.
std::shared_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& draft_dir,
                                                   const std::filesystem::path& target_dir, const ModelSpec& target,
                                                   int threads = 0);

}  // namespace m3::ref
