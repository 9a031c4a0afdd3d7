// Paged-cache block accounting: which of the backend's num_cache_blocks() physical blocks each
// sequence owns. The scheduler grows a sequence's block table as its tokens are scheduled and
// gives every block back when the sequence finishes, is cancelled or is preempted. Single-threaded
// (the engine thread owns it); every misuse (double free, foreign block) is an m3::Error.
#pragma once
#include <cstdint>
#include <vector>

namespace m3 {

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_free() const { return int(free_.size()); }
  int num_used() const { return num_blocks_ - num_free(); }

  // Blocks needed to hold `tokens` positions.
  int blocks_for(int64_t tokens) const;
  // Extra blocks `table` needs so that it covers `tokens` positions (0 when it already does).
  int blocks_missing(const std::vector<int32_t>& table, int64_t tokens) const;
  // Grows `table` to cover `tokens` positions. All or nothing: returns false and leaves `table`
  // untouched when there are not enough free blocks.
  bool ensure(std::vector<int32_t>& table, int64_t tokens);
  // Returns the blocks of `table` past those that cover `tokens` positions to the pool.
  void shrink(std::vector<int32_t>& table, int64_t tokens);
  // Returns every block of `table` to the pool and clears it.
  void release(std::vector<int32_t>& table);

 private:
  int num_blocks_, block_size_;
  std::vector<int32_t> free_;   // stack: most recently freed on top
  std::vector<uint8_t> owned_;  // 1 while a block sits in some table
};

}  // namespace m3
