// Params and work shape of the fused q/k norm + partial RoPE + cache insert
// (kernels/qk_norm_rope_cache.cuh).
#pragma once
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kRopeMaxDim = 256;  // largest head_dim / index_dim the warp mapping covers

struct QkNormRopeCacheParams {
  const float* proj = nullptr;  // [T, proj_stride]
  int64_t proj_stride = 0;
  int num_tokens = 0;
  int num_heads = 0, kv_heads = 0, head_dim = 0;
  int index_heads = 0, index_dim = 0;  // index_heads = 0: full-attention layer (no iq/ik)
  int rotary_dim = 0;
  float eps = 1e-6f;
  const float* q_norm = nullptr;   // [D]
  const float* k_norm = nullptr;   // [D]
  const float* iq_norm = nullptr;  // [ID]
  const float* ik_norm = nullptr;  // [ID]
  const float* inv_freq = nullptr;  // [rotary_dim / 2] fp32, as the reference builds it
  const int32_t* positions = nullptr;  // [T] (-1 = padding; rotated as position 0)
  const int32_t* slots = nullptr;      // [T] (-1 = padding: no cache write)
  float* q_out = nullptr;   // [T, H*D]
  float* iq_out = nullptr;  // [T, IH*ID]
  void* k_cache = nullptr;  // [slots, KV, D]
  void* v_cache = nullptr;  // [slots, KV, D]
  void* ik_cache = nullptr; // [slots, ID]
  float k_inv_scale = 1, v_inv_scale = 1, ik_inv_scale = 1;  // stored = encode(x * inv_scale)
  CacheFmt kv_fmt = CacheFmt::FP8, ik_fmt = CacheFmt::FP8;    // instantiation (native::make_qk_norm_rope_params)

  M3_HOST_DEVICE int vectors_per_token() const {
    return num_heads + 2 * kv_heads + (index_heads > 0 ? index_heads + 1 : 0);
  }
  M3_HOST_DEVICE int64_t num_work() const { return int64_t(num_tokens) * vectors_per_token(); }
};

constexpr int kRopeWarps = 8;  // (token, vector) warp items per CTA-sized item
// Item = kRopeWarps warp items (warp i of the group: warp item kRopeWarps * w + i).
M3_HOST_DEVICE inline WorkShape qk_norm_rope_cache_shape(const QkNormRopeCacheParams& p) {
  return {ceil_div(p.num_work(), kRopeWarps), 32 * kRopeWarps, 0};
}

}  // namespace m3::kernels
