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
    kp_.push_back(k_[size_t(l)].data());
    vp_.push_back(v_[size_t(l)].data());
    ikp_.push_back(spec.sparse(l) ? ik_[size_t(l)].data() : nullptr);
  }
  slot_pos_.assign(slots, -1);
}

PagedCache::PagedCache(const ModelSpec& spec, int num_blocks, std::vector<float*> k, std::vector<float*> v,
                       std::vector<float*> ik)
    : block_size_(spec.index_block), num_blocks_(num_blocks), kv_dim_(spec.kv_dim()), index_dim_(spec.index_dim) {
  M3_CHECK(block_size_ > 0, "cache block size (index_block) must be > 0, got {}", block_size_);
  M3_CHECK(num_blocks > 0, "num_cache_blocks must be > 0, got {}", num_blocks);
  const size_t L = size_t(spec.num_layers);
  M3_CHECK(k.size() == L && v.size() == L && ik.size() == L, "borrowed caches: {} / {} / {} layers of buffers, the model has {}",
           k.size(), v.size(), ik.size(), L);
  for (int l = 0; l < spec.num_layers; ++l) {
    M3_CHECK(k[size_t(l)] && v[size_t(l)], "borrowed caches: layer {} has no K or V buffer", l);
    M3_CHECK(spec.sparse(l) == (ik[size_t(l)] != nullptr), "borrowed caches: layer {} {} an index-K buffer", l,
             spec.sparse(l) ? "needs" : "(full attention) takes no");
  }
  kp_ = std::move(k);
  vp_ = std::move(v);
  ikp_ = std::move(ik);
  slot_pos_.assign(size_t(num_blocks) * size_t(block_size_), -1);
}

}  // namespace m3::ref
