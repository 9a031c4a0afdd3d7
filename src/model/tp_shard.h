// Tensor-parallel shards of the model for the CPU reference (issue 14; docs/tensor-parallel.md):
// what rank r of N holds, in the same split the prepared arena uses (model/prepare.cpp):
//   query heads, KV heads and index-query heads / N (contiguous ranges: rank r has heads
//   [r n/N, (r+1) n/N)); when N is a multiple of the KV heads instead, each rank holds the one KV
//   (and index) head its query heads use, replicated on N / KV ranks (M3 at TP8); the index key (one head), every norm, the router and its bias, the
//   embedding replicated; O projection and MLP / expert down projections by input columns (their
//   outputs are partial sums the ranks add: the all-reduce after attention and after the FFN);
//   dense, routed-expert and shared-expert widths / N (gate / up rows, down columns); lm_head by
//   vocabulary rows [r V/N, (r+1) V/N) (the ranks gather the logits).
#pragma once
#include <string>

#include "model/spec.h"
#include "model/weights.h"

namespace m3 {
class WeightSource;  // model/prepare.h
}

namespace m3 {

// The shape one rank computes with: heads and the three MLP widths divided by tp, KV and index
// heads divided (or 1 when replicated); vocab_size stays the model's (token ids index the whole embedding). Throws, naming the
// field, its value and tp, when tp does not divide a dimension it splits (or vocab_size).
ModelSpec tp_rank_spec(const ModelSpec& spec, int tp, const std::string& origin = "--tp");

// The first KV head (global index) rank `rank` of `tp` holds (spec: the full model's).
int tp_rank_kv_head(const ModelSpec& spec, int rank, int tp);

// Rank `rank` of `tp`'s slices (spec: the full model's), read from a weight source row range by
// row range: from a checkpoint's binding (model/prepare.h make_weight_source) a rank reads only
// its slices of the files, never a whole tensor it does not hold.
ModelWeights tp_rank_weights(const ModelSpec& spec, const WeightSource& src, int rank, int tp);
// The same from the full-model weights w in memory.
ModelWeights tp_rank_weights(const ModelSpec& spec, const ModelWeights& w, int rank, int tp);

}  // namespace m3
