// BlockManager: a free stack plus an ownership bitmap that catches double frees.
#include "runtime/block_manager.h"

#include "core/check.h"

namespace m3 {

BlockManager::BlockManager(int num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  M3_CHECK(num_blocks > 0, "block manager: num_blocks must be > 0, got {}", num_blocks);
  M3_CHECK(block_size > 0, "block manager: block_size must be > 0, got {}", block_size);
  free_.reserve(size_t(num_blocks));
  // NOTE: pushed in reverse so that the first allocations hand out 0, 1, 2, ... (readable traces).
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  owned_.assign(size_t(num_blocks), 0);
}

int BlockManager::blocks_for(int64_t tokens) const {
  M3_CHECK(tokens >= 0, "block manager: negative token count {}", tokens);
  return int((tokens + block_size_ - 1) / block_size_);
}

int BlockManager::blocks_missing(const std::vector<int32_t>& table, int64_t tokens) const {
  int need = blocks_for(tokens) - int(table.size());
  return need > 0 ? need : 0;
}

bool BlockManager::ensure(std::vector<int32_t>& table, int64_t tokens) {
  int need = blocks_missing(table, tokens);
  if (need > num_free()) return false;
  for (int i = 0; i < need; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    owned_[size_t(b)] = 1;
    table.push_back(b);
  }
  return true;
}

void BlockManager::shrink(std::vector<int32_t>& table, int64_t tokens) {
  M3_CHECK(tokens >= 0, "block manager: shrink to {} positions", tokens);
  const size_t keep = size_t(blocks_for(tokens));
  if (table.size() <= keep) return;
  std::vector<int32_t> tail(table.begin() + ptrdiff_t(keep), table.end());
  table.resize(keep);
  release(tail);
}

void BlockManager::release(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    M3_CHECK(b >= 0 && b < num_blocks_, "block manager: block id {} outside [0, {})", b, num_blocks_);
    M3_CHECK(owned_[size_t(b)], "block manager: block {} freed twice", b);
    owned_[size_t(b)] = 0;
    free_.push_back(b);
  }
  table.clear();
}

}  // namespace m3
