// A validated step: the batch flattened to tokens (sequence, position, cache slot), each
// sequence's slot list for positions [0, end), and which tokens return logits. plan_step() is
// where every input of Backend::step is checked (token ids, positions, block tables, block ids,
// unwritten history, two tokens writing one slot).
#pragma once
#include <cstdint>
#include <vector>

#include "model/spec.h"
#include "ref/kv_cache.h"
#include "runtime/backend.h"

namespace m3::ref {

struct StepPlan {
  int num_tokens = 0;
  std::vector<int32_t> token_id, pos;         // per token, batch order
  std::vector<int> seq;                       // per token: its sequence
  std::vector<int64_t> slot;                  // per token: cache slot it writes
  std::vector<std::vector<int64_t>> seq_slots;  // per sequence: slot of each position 0 .. end-1
  std::vector<int> out_tokens;                // tokens that return logits, in output row order
  std::vector<int> first_row, num_rows;       // per sequence
  std::vector<int> aux_layers;                // StepBatch::aux_layers (checked)
  std::vector<int> aux_tokens;                // tokens whose aux rows return, in output row order
  std::vector<int> aux_first_row;             // per sequence (-1: none)
};

StepPlan plan_step(const ModelSpec& spec, const PagedCache& cache, const StepBatch& batch);

}  // namespace m3::ref
