// PagedCache: plain vectors per layer; NaN-filled so a read of an unwritten slot cannot pass
// silently even if the slot bookkeeping were bypassed.
#include "ref/kv_cache.h"

#include <cmath>

#include "core/check.h"

namespace m3::ref {

PagedCache::PagedCache(const ModelSpec& spec, int num_blocks)
    : block_size_(spec.index_block), num_blocks_(num_blocks), kv_dim_(spec.kv_dim()), index_dim_(spec.index_dim) {
  M3_CHECK(block_size_ > 0, "cache block size (index_block) must be > 0, got {}", block_size_);
  M3_CHECK(num_blocks > 0, "num_cache_blocks must be > 0, got {}", num_blocks);
  size_t slots = size_t(num_blocks) * size_t(block_size_);
  k_.resize(size_t(spec.num_layers));
  v_.resize(size_t(spec.num_layers));
  ik_.resize(size_t(spec.num_layers));
  for (int l = 0; l < spec.num_layers; ++l) {
    k_[size_t(l)].assign(slots * size_t(kv_dim_), NAN);
    v_[size_t(l)].assign(slots * size_t(kv_dim_), NAN);
    if (spec.sparse(l)) ik_[size_t(l)].assign(slots * size_t(index_dim_), NAN);
  }
  slot_pos_.assign(slots, -1);
}

}  // namespace m3::ref
