// The one validation of a step (Backend::step input), shared by every backend and run once per
// step before anything is launched or written: token ids, positions, block tables and block ids,
// the history earlier steps wrote (SlotHistory: the position each cache slot holds), no two new
// tokens writing one slot, and no new token overwriting history another sequence of the step
// reads. Errors name the sequence, the field and the value.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace m3 {

struct StepLimits {
  int vocab_size = 0;
  int block_size = 0;
  int num_blocks = 0;
  int64_t max_len = 0;          // positions a sequence may reach (exclusive end)
  std::string max_len_name;     // what bounds it, for the message ("max_model_len", "max_position_embeddings")
  int num_layers = -1;          // >= 0: StepBatch::aux_layers checked against it (< 0: aux refused)
};

// The position each cache slot holds (-1: nothing written).
class SlotHistory {
 public:
  virtual ~SlotHistory() = default;
  virtual int32_t written(int64_t slot) const = 0;
};

// EveryPosition: every position below start_pos is checked (the CPU reference). BlockEnds: the
// first and the last position of each block below start_pos (O(blocks), the GPU backends).
enum class HistoryCheck { EveryPosition, BlockEnds };

// One checked sequence: its block table cut to the blocks positions [0, start_pos + num_new) need.
struct CheckedSeq {
  int32_t start_pos = 0;
  int32_t num_new = 0;
  std::span<const int32_t> table;
};

std::vector<CheckedSeq> check_step(const StepBatch& batch, const StepLimits& limits, const SlotHistory& history,
                                   HistoryCheck mode);

inline int64_t slot_of(std::span<const int32_t> table, int64_t pos, int block_size) {
  return int64_t(table[size_t(pos / block_size)]) * block_size + pos % block_size;
}

}  // namespace m3
