// Random prepared weights on the device for the benchmarks (device_weights.cpp): one cudaMalloc
// of a PreparedLayout's arena, every tensor filled on the device with random values in its stored
// format (FP8 codes without NaNs, E2M1 pairs, E8M0 scales near 2^-7, BF16 / F32 values in small
// ranges), row padding left zero, so no checkpoint and no host quantization are needed (the real
// model's 60 layers at --tp-shard 4 fill in well under a second). Views as the kernels take them.
//
// The arena is a native::PreparedWeights made by PreparedWeights::create_on_device (one
// cudaMalloc, filled here on the device), so the native forward runs on exactly these weights
// (prepared(); the "native" bench path) and no second weight allocation exists.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "model/prepare.h"
#include "native/kv_cache.h"
#include "native/linear.h"
#include "native/moe.h"
#include "native/prepared.h"

namespace m3::bench {

class DeviceArena {
 public:
  DeviceArena(const PreparedLayout& layout, uint64_t seed, cudaStream_t s);  // allocates and fills
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  uint8_t* base() const { return base_; }
  const PreparedLayout& layout() const { return w_->layout(); }
  // The same memory as the native path's prepared weights (shared: keep it while a backend uses it).
  std::shared_ptr<const native::PreparedWeights> prepared() const { return w_; }

  native::Fp8Weight qkv(int l) const;
  native::Fp8Weight o(int l) const;
  native::MoeWeights moe(int l) const;

 private:
  std::shared_ptr<native::PreparedWeights> w_;
  uint8_t* base_ = nullptr;  // w_'s arena
};

// Fills every tensor of `layout` at `base` (which must be zeroed first for the row padding).
void fill_prepared_random(uint8_t* base, const PreparedLayout& layout, uint64_t seed, cudaStream_t s);
// Random FP8 (or BF16) codes in every layer's K / V / index-K caches (scales stay 1).
void fill_cache_random(native::DeviceKvCache& cache, uint64_t seed, cudaStream_t s);

}  // namespace m3::bench
