// An EAGLE3 draft checkpoint's tensors, in fp32 on the host (the CPU reference runs them as they
// are; the CUDA draft, native/eagle3_net.h, uploads them in BF16), and the loader of the layout
// vLLM reads (model/eagle3_spec.h has the shape).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "model/eagle3_spec.h"
#include "model/weights.h"

namespace m3 {

class WeightSource;

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

struct Eagle3Checkpoint {
  Eagle3Spec spec;
  Eagle3Weights weights;
};
// The draft `draft_dir` (config.json + tensors) beside the target checkpoint `target_dir` of spec
// `target`, whose embedding / lm_head it reads where the draft shares them.
Eagle3Checkpoint load_eagle3_checkpoint(const std::filesystem::path& draft_dir, const std::filesystem::path& target_dir,
                                        const ModelSpec& target);

}  // namespace m3
