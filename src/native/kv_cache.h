// Paged device caches of the native path: per layer a main K and V cache, per sparse layer an
// index-K cache. Every cache is a pool of `num_blocks` physical blocks of `block_size` tokens
// (block_size = spec.index_block, 128 for MiniMax-M3); position p of a sequence lives at
//   slot = block_table[p / block_size] * block_size + p % block_size
// and slot -1 marks a padding row that is never written.
//
// Layouts (elements; row-major, the last index fastest):
//   K, V : [num_blocks, block_size, kv_heads, head_dim]  -> element (slot * kv_heads + g) * head_dim + d
//   IK   : [num_blocks, block_size, index_dim]           -> element slot * index_dim + d
// Element types: FP8 E4M3 (default) or BF16, chosen per cache kind (kv_dtype, ik_dtype).
// Scales: one fp32 scalar per layer and cache (k_scale, v_scale, ik_scale); stored FP8 value e
// means e * scale (stored = e4m3(x / scale)); BF16 caches use scale 1.
//
// This header is plain C++ (no CUDA include) so CPU tests can use the layout helpers; the
// DeviceKvCache methods are defined in kv_cache.cpp, built only with CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/spec.h"

// Same declaration as CUDA's driver_types.h, so this header needs no CUDA include.
typedef struct CUstream_st* cudaStream_t;

namespace m3::native {

struct KvCacheShape {
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 0;   // tokens per block
  int kv_heads = 0;
  int head_dim = 0;
  int index_dim = 0;    // 0 when no layer has an index-K cache
  DType kv_dtype = DType::F8_E4M3;
  DType ik_dtype = DType::F8_E4M3;
  std::vector<uint8_t> has_index;  // per layer: 1 = sparse layer (owns an index-K cache)

  int64_t num_slots() const { return int64_t(num_blocks) * block_size; }
  size_t kv_elems() const { return size_t(num_slots()) * size_t(kv_heads) * size_t(head_dim); }
  size_t ik_elems() const { return size_t(num_slots()) * size_t(index_dim); }
  size_t kv_bytes() const { return kv_elems() * dtype_size(kv_dtype); }  // one of K or V, one layer
  size_t ik_bytes() const { return ik_elems() * dtype_size(ik_dtype); }  // one sparse layer
  size_t total_bytes() const {
    size_t n = 0;
    for (int l = 0; l < num_layers; ++l) n += 2 * kv_bytes() + (has_index[size_t(l)] ? ik_bytes() : 0);
    return n;
  }
  void validate() const {
    M3_CHECK(num_layers > 0, "kv cache: num_layers must be > 0, got {}", num_layers);
    M3_CHECK(num_blocks > 0, "kv cache: num_blocks must be > 0, got {}", num_blocks);
    M3_CHECK(block_size > 0, "kv cache: block_size must be > 0, got {}", block_size);
    M3_CHECK(num_slots() < (int64_t(1) << 31), "kv cache: {} blocks x {} tokens overflow int32 slots",
             num_blocks, block_size);
    M3_CHECK(kv_heads > 0, "kv cache: kv_heads must be > 0, got {}", kv_heads);
    M3_CHECK(head_dim > 0 && head_dim % 16 == 0, "kv cache: head_dim must be a positive multiple of 16, got {}",
             head_dim);
    M3_CHECK(kv_dtype == DType::F8_E4M3 || kv_dtype == DType::BF16, "kv cache: kv_dtype {} unsupported (F8_E4M3 or BF16)",
             dtype_name(kv_dtype));
    M3_CHECK(ik_dtype == DType::F8_E4M3 || ik_dtype == DType::BF16, "kv cache: ik_dtype {} unsupported (F8_E4M3 or BF16)",
             dtype_name(ik_dtype));
    M3_CHECK(has_index.size() == size_t(num_layers), "kv cache: has_index has {} entries for {} layers",
             has_index.size(), num_layers);
    bool any = false;
    for (auto h : has_index) any = any || h;
    M3_CHECK(!any || (index_dim > 0 && index_dim % 16 == 0),
             "kv cache: index_dim must be a positive multiple of 16 when a layer is sparse, got {}", index_dim);
  }
};

// The cache shape of a model: every layer has K/V, sparse layers an index-K cache.
inline KvCacheShape kv_cache_shape(const ModelSpec& spec, int num_blocks, DType kv_dtype = DType::F8_E4M3,
                                   DType ik_dtype = DType::F8_E4M3) {
  KvCacheShape s;
  s.num_layers = spec.num_layers;
  s.num_blocks = num_blocks;
  s.block_size = spec.index_block;
  s.kv_heads = spec.num_kv_heads;
  s.head_dim = spec.head_dim;
  s.index_dim = spec.index_dim;
  s.kv_dtype = kv_dtype;
  s.ik_dtype = ik_dtype;
  s.has_index.resize(size_t(spec.num_layers));
  for (int l = 0; l < spec.num_layers; ++l) s.has_index[size_t(l)] = spec.sparse(l) ? 1 : 0;
  return s;
}

// Element offsets of the layouts above.
inline int64_t kv_elem_offset(int64_t slot, int head, int d, int kv_heads, int head_dim) {
  return (slot * kv_heads + head) * head_dim + d;
}
inline int64_t ik_elem_offset(int64_t slot, int d, int index_dim) { return slot * index_dim + d; }

// One layer's caches as the kernels see them (device pointers, borrowed).
struct KvLayerView {
  void* k = nullptr;   // [num_blocks, block_size, kv_heads, head_dim] of kv_dtype
  void* v = nullptr;   // same
  void* ik = nullptr;  // [num_blocks, block_size, index_dim] of ik_dtype; null on full-attention layers
  float k_scale = 1, v_scale = 1, ik_scale = 1;
  DType kv_dtype = DType::F8_E4M3, ik_dtype = DType::F8_E4M3;
  int num_blocks = 0, block_size = 0, kv_heads = 0, head_dim = 0, index_dim = 0;
};

// Owns the device memory of all layers' caches (one allocation per cache).
class DeviceKvCache {
 public:
  explicit DeviceKvCache(const KvCacheShape& shape);
  // BORROWS the caches of `shape` from device buffers the caller owns (a host framework's; issue
  // 16): k[l], v[l] of shape.kv_bytes() each, ik[l] of shape.ik_bytes() on the sparse layers (null
  // on the others). Nothing is allocated; the buffers must outlive this object.
  DeviceKvCache(const KvCacheShape& shape, std::vector<void*> k, std::vector<void*> v, std::vector<void*> ik);
  ~DeviceKvCache();
  DeviceKvCache(const DeviceKvCache&) = delete;
  DeviceKvCache& operator=(const DeviceKvCache&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  KvLayerView layer(int l) const;
  // Scales of layer l (FP8 caches; must stay 1 for BF16). Checked: finite and > 0.
  void set_scales(int l, float k_scale, float v_scale, float ik_scale = 1.0f);
  // Sets every byte of every cache to `byte` (tests poison caches with it; 0x7f is an E4M3 NaN).
  void fill(uint8_t byte, cudaStream_t stream);

 private:
  KvCacheShape shape_;
  bool owned_ = true;
  std::vector<void*> k_, v_, ik_;
  std::vector<float> k_scale_, v_scale_, ik_scale_;
};

}  // namespace m3::native
