// DeviceKvCache: one cudaMalloc per layer and cache kind, freed in the destructor.
#include "native/kv_cache.h"

#include <cmath>
#include <utility>

#include "native/cuda_check.h"

namespace m3::native {

DeviceKvCache::DeviceKvCache(const KvCacheShape& shape) : shape_(shape) {
  shape_.validate();
  size_t L = size_t(shape_.num_layers);
  k_.assign(L, nullptr);
  v_.assign(L, nullptr);
  ik_.assign(L, nullptr);
  k_scale_.assign(L, 1.0f);
  v_scale_.assign(L, 1.0f);
  ik_scale_.assign(L, 1.0f);
  try {
    for (size_t l = 0; l < L; ++l) {
      M3_CUDA_CHECK(cudaMalloc(&k_[l], shape_.kv_bytes()));
      M3_CUDA_CHECK(cudaMalloc(&v_[l], shape_.kv_bytes()));
      if (shape_.has_index[l]) M3_CUDA_CHECK(cudaMalloc(&ik_[l], shape_.ik_bytes()));
    }
  } catch (...) {
    for (size_t l = 0; l < L; ++l) {
      cudaFree(k_[l]);
      cudaFree(v_[l]);
      cudaFree(ik_[l]);
    }
    throw;
  }
}

DeviceKvCache::DeviceKvCache(const KvCacheShape& shape, std::vector<void*> k, std::vector<void*> v,
                             std::vector<void*> ik)
    : shape_(shape), owned_(false), k_(std::move(k)), v_(std::move(v)), ik_(std::move(ik)) {
  shape_.validate();
  const size_t L = size_t(shape_.num_layers);
  M3_CHECK(k_.size() == L && v_.size() == L && ik_.size() == L,
           "kv cache: borrowed caches for {} / {} / {} layers (K / V / index-K), the model has {}", k_.size(), v_.size(),
           ik_.size(), L);
  for (size_t l = 0; l < L; ++l) {
    M3_CHECK(k_[l] && v_[l], "kv cache: layer {}: no borrowed {} cache", l, k_[l] ? "V" : "K");
    M3_CHECK(bool(ik_[l]) == bool(shape_.has_index[l]), "kv cache: layer {} is a {} layer: {} index-K cache expected", l,
             shape_.has_index[l] ? "sparse" : "full-attention", shape_.has_index[l] ? "an" : "no");
  }
  k_scale_.assign(L, 1.0f);
  v_scale_.assign(L, 1.0f);
  ik_scale_.assign(L, 1.0f);
}

DeviceKvCache::~DeviceKvCache() {
  if (!owned_) return;
  for (size_t l = 0; l < k_.size(); ++l) {
    cudaFree(k_[l]);
    cudaFree(v_[l]);
    cudaFree(ik_[l]);
  }
}

KvLayerView DeviceKvCache::layer(int l) const {
  M3_CHECK(l >= 0 && l < shape_.num_layers, "kv cache: layer {} out of range [0, {})", l, shape_.num_layers);
  KvLayerView v;
  v.k = k_[size_t(l)];
  v.v = v_[size_t(l)];
  v.ik = ik_[size_t(l)];
  v.k_scale = k_scale_[size_t(l)];
  v.v_scale = v_scale_[size_t(l)];
  v.ik_scale = ik_scale_[size_t(l)];
  v.kv_dtype = shape_.kv_dtype;
  v.ik_dtype = shape_.ik_dtype;
  v.num_blocks = shape_.num_blocks;
  v.block_size = shape_.block_size;
  v.kv_heads = shape_.kv_heads;
  v.head_dim = shape_.head_dim;
  v.index_dim = shape_.index_dim;
  return v;
}

void DeviceKvCache::set_scales(int l, float k_scale, float v_scale, float ik_scale) {
  M3_CHECK(l >= 0 && l < shape_.num_layers, "kv cache: layer {} out of range [0, {})", l, shape_.num_layers);
  auto ok = [](float s) { return std::isfinite(s) && s > 0; };
  M3_CHECK(ok(k_scale) && ok(v_scale) && ok(ik_scale), "kv cache: layer {} scales must be finite and > 0, got k {} v {} ik {}",
           l, k_scale, v_scale, ik_scale);
  M3_CHECK(shape_.kv_dtype != DType::BF16 || (k_scale == 1 && v_scale == 1),
           "kv cache: layer {}: a BF16 K/V cache takes no scale (got k {} v {})", l, k_scale, v_scale);
  M3_CHECK(shape_.ik_dtype != DType::BF16 || ik_scale == 1,
           "kv cache: layer {}: a BF16 index-K cache takes no scale (got {})", l, ik_scale);
  k_scale_[size_t(l)] = k_scale;
  v_scale_[size_t(l)] = v_scale;
  ik_scale_[size_t(l)] = ik_scale;
}

void DeviceKvCache::fill(uint8_t byte, cudaStream_t stream) {
  for (size_t l = 0; l < k_.size(); ++l) {
    M3_CUDA_CHECK(cudaMemsetAsync(k_[l], byte, shape_.kv_bytes(), stream));
    M3_CUDA_CHECK(cudaMemsetAsync(v_[l], byte, shape_.kv_bytes(), stream));
    if (ik_[l]) M3_CUDA_CHECK(cudaMemsetAsync(ik_[l], byte, shape_.ik_bytes(), stream));
  }
}

}  // namespace m3::native
