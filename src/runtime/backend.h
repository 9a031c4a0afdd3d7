// The step interface every execution backend implements (CPU reference today; CUDA native and
// mono later) and the scheduler drives. A backend owns a paged KV/index-K cache pool of
// num_cache_blocks() blocks of cache_block_size() tokens; which physical blocks a sequence uses is
// decided by the caller (runtime/block_manager) and passed in each step as a block table.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/spec.h"
#include "runtime/sampler.h"

namespace m3 {

// A token the backend samples from a sequence's last logits row in the step: exactly
// sample_token(row, vocab, params, state) on a copy of `state` (state.draws = this draw's index;
// the caller advances its own counter, by one unless greedy). params.seed is not read.
struct SamplingRequest {
  SamplingParams params;
  SamplerState state;
};

// One sequence's share of a step: append `tokens` at positions start_pos .. start_pos+n-1.
// Prefill (n > 1, possibly a chunk), decode (n == 1) and mixed batches are all this one shape.
struct SeqStep {
  int32_t start_pos = 0;              // tokens already in the cache for this sequence
  std::vector<int32_t> tokens;        // new token ids, n >= 1
  std::vector<int32_t> block_table;   // physical block ids covering positions [0, start_pos + n)
  bool all_logits = false;            // logits for every new token (else only the last)
  std::optional<SamplingRequest> sample{};  // sample a token on the backend (StepOutput::tokens)
  // false: the caller does not read this sequence's logits. When no sequence of a step wants them,
  // a backend may return StepOutput::logits empty (rows and first_row/num_rows stay as usual).
  bool want_logits = true;
  // Return this sequence's auxiliary hidden states (StepBatch::aux_layers) for every new token.
  bool want_aux = false;
};

struct StepBatch {
  std::vector<SeqStep> seqs;
  // Auxiliary hidden states (EAGLE3 drafts, runtime/drafter.h): for each layer l listed, the hidden
  // state entering layer l (the residual stream after layers 0 .. l-1; l == num_layers: after the
  // last layer, before the final norm), returned for every new token of the sequences that set
  // SeqStep::want_aux (StepOutput::aux). Each l in [0, num_layers], no repeats; a backend that
  // cannot return them refuses the step saying so.
  std::vector<int> aux_layers{};
  int num_tokens() const {
    int n = 0;
    for (const auto& s : seqs) n += int(s.tokens.size());
    return n;
  }
};

// Optional per-step trace of a backend's discrete choices (conformance, tests):
//   blocks:  the indexer's, for each sparse layer in layer order, for each new token of the batch
//            in batch order, for each index group, the selected block ids (sorted ascending);
//   experts: the router's, for each MoE layer in layer order, for each new token in batch order,
//            the top-k expert ids in choice order (best first). A backend that does not report
//            experts leaves moe_layers and experts empty;
//   cache:   on request, the cache entries the step wrote (below).
// The CPU reference can also take such a trace as the decisions to follow in a step (ref/follow.h).
struct SelectionTrace {
  std::vector<int> layers;  // model layer index of each entry of blocks
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> blocks;  // [sparse layer][token][group] -> ids
  std::vector<int> moe_layers;  // model layer index of each entry of experts
  std::vector<std::vector<std::vector<int32_t>>> experts;  // [moe layer][token] -> top-k ids, best first
  // In: record_cache asks for the new tokens' cache entries too (tests; a copy per layer). Out: for
  // every layer, what the new tokens' K, V and index-K entries read back as (decoded value times
  // the layer's scale), rows in batch order: cache_k / cache_v [layer][token * kv_dim + i],
  // cache_ik [layer][token * index_dim + i] (empty on full-attention layers).
  bool record_cache = false;
  std::vector<std::vector<float>> cache_k, cache_v, cache_ik;
  void clear() {  // keeps record_cache
    layers.clear();
    blocks.clear();
    moe_layers.clear();
    experts.clear();
    cache_k.clear();
    cache_v.clear();
    cache_ik.clear();
  }
};

struct StepOutput {
  int vocab = 0;
  std::vector<float> logits;     // rows x vocab, rows in batch order
  std::vector<int> first_row;    // per sequence: its first logits row
  std::vector<int> num_rows;     // per sequence: 1, or n when all_logits
  // Per sequence: the token sampled for its SeqStep::sample, -1 where none was requested; empty
  // when no sequence asked (or the backend does not sample: the caller then samples the logits).
  std::vector<int32_t> tokens;
  // The execution path that ran the step ("native", "mono", ...; backends with one path leave
  // "native") and, when a preferred path declined it, "<path>:<reason>" (runtime/dispatcher.h).
  std::string path = "native";
  std::string fallback_reason;
  // Per sequence that set want_aux: its new tokens' rows of aux_width = aux_layers.size() x hidden
  // floats (the layers in aux_layers' order), from aux_first_row[seq] (-1 for the others).
  std::vector<float> aux;
  int aux_width = 0;
  std::vector<int> aux_first_row;
  const float* aux_row(int seq, int i = 0) const {
    return aux.data() + size_t(aux_first_row[size_t(seq)] + i) * size_t(aux_width);
  }
  const float* row(int seq, int i = 0) const {
    return logits.data() + size_t(first_row[size_t(seq)] + i) * size_t(vocab);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;            // "cpu-ref", "cuda-native", ...
  virtual const ModelSpec& spec() const = 0;
  virtual int cache_block_size() const = 0;
  virtual int num_cache_blocks() const = 0;
  // Runs one forward step over the batch: writes K/V/index-K of the new tokens into the cache at
  // the slots the block tables give, and returns logits. Throws m3::Error on malformed input.
  virtual StepOutput step(const StepBatch& batch, SelectionTrace* trace = nullptr) = 0;
  // Whether step() returns auxiliary hidden states (StepBatch::aux_layers; EAGLE3 drafts).
  virtual bool returns_aux() const { return false; }
};

}  // namespace m3
