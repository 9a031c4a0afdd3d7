// Paged caches of the CPU reference, all fp32 (what is written may first be rounded through the
// GPU cache codec: ref/cache_codec.h): per layer K (normed, rotated) and V (raw), each
// [num_blocks * block_size, kv_heads * head_dim]; per sparse layer the index-K cache
// [num_blocks * block_size, index_dim]. Position p of a sequence lives at
//   slot = block_table[p / block_size] * block_size + p % block_size.
// The cache also remembers which position each slot last received, so a step that reads a slot
// its block table never wrote fails with a clear error instead of attending to garbage.
#pragma once
#include <cstdint>
#include <vector>

#include "model/spec.h"

namespace m3::ref {

class PagedCache {
 public:
  PagedCache(const ModelSpec& spec, int num_blocks);
  // The same over buffers the caller owns and keeps alive (the library level's borrowed caches):
  // k[l], v[l] [num_blocks * block_size, kv_dim] and, on sparse layers, ik[l] [.., index_dim] fp32
  // (null on full-attention layers). Nothing is cleared: slots count as never written.
  PagedCache(const ModelSpec& spec, int num_blocks, std::vector<float*> k, std::vector<float*> v,
             std::vector<float*> ik);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return int64_t(num_blocks_) * block_size_; }
  int kv_stride() const { return kv_dim_; }
  int ik_stride() const { return index_dim_; }

  PagedCache(const PagedCache&) = delete;  // the buffer pointers would alias
  PagedCache& operator=(const PagedCache&) = delete;
  PagedCache(PagedCache&&) = default;

  float* k(int layer) { return kp_[size_t(layer)]; }
  float* v(int layer) { return vp_[size_t(layer)]; }
  float* ik(int layer) { return ikp_[size_t(layer)]; }  // sparse layers only

  // Slot of position pos through a block table (the table must cover pos: checked by the caller).
  int64_t slot_of(const std::vector<int32_t>& table, int64_t pos) const {
    return int64_t(table[size_t(pos / block_size_)]) * block_size_ + pos % block_size_;
  }
  int32_t written_pos(int64_t slot) const { return slot_pos_[size_t(slot)]; }
  void mark_written(int64_t slot, int32_t pos) { slot_pos_[size_t(slot)] = pos; }

 private:
  int block_size_, num_blocks_, kv_dim_, index_dim_;
  std::vector<std::vector<float>> k_, v_, ik_;  // per layer, when owned (ik_ empty on full-attention layers)
  std::vector<float*> kp_, vp_, ikp_;            // per layer: the buffers used (owned or borrowed)
  std::vector<int32_t> slot_pos_;               // position last written at each slot, -1 = never
};

}  // namespace m3::ref
