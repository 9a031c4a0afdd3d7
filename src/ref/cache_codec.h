// Cache codec emulation of the CPU reference: what it writes into its K/V and index-K caches can
// be rounded through the same element codec the GPU's caches use (native/kv_cache.h,
// kernels/qk_norm_rope_cache.cuh), so a comparison against the GPU on the same weights does not
// count cache rounding as error. Read-back value of a written x:
//   F32 (default, exact):  x
//   BF16:                  bf16(x), round to nearest even (scale must be 1, as on the GPU)
//   F8_E4M3 with scale s:  e4m3(x * inv_s) * s, inv_s = 1.0f / s (one fp32 division, as the GPU's
//                          launcher computes it; one fp32 multiply before the encode, as the
//                          kernel does), e4m3 = core/codecs.h f32_to_e4m3 (round to nearest even,
//                          saturating at +-448; the kernel calls the same function), decoded
//                          exactly and multiplied by s once in fp32.
// The stored codes are therefore bit-identical to the GPU's for the same input value; only the
// place where the GPU applies s on reading (folded into a dot product or a softmax weight) can
// differ by fp32 rounding.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/spec.h"

namespace m3::ref {

struct CacheCodec {
  DType dtype = DType::F32;
  float scale = 1, inv_scale = 1;

  // Checks: dtype F32, BF16 or F8_E4M3; scale finite and > 0, and 1 unless FP8.
  static CacheCodec make(DType dtype, float scale = 1);
  bool exact() const { return dtype == DType::F32; }
  float round(float x) const;  // the value a read of the cache returns after writing x
  // dst[i] = round(src[i]), i < n (src == dst allowed).
  void store(const float* src, int64_t n, float* dst) const;
};

// Per-layer codecs of the three caches (ik on sparse layers only; unused elsewhere).
struct CacheCodecs {
  std::vector<CacheCodec> k, v, ik;
  bool exact() const;
};

// What RefOptions asks for (ref/engine.h): one dtype per cache kind and one scale per layer and
// cache (per-layer vectors when given, else the scalar for every layer).
struct CacheEmulation {
  DType kv_dtype = DType::F32;  // main K/V cache: F32 (exact), BF16 or F8_E4M3
  DType ik_dtype = DType::F32;  // index-K cache: likewise
  float k_scale = 1, v_scale = 1, ik_scale = 1;        // FP8 scales of every layer ...
  std::vector<float> k_scales, v_scales, ik_scales;    // ... or one per layer (num_layers entries)
};
CacheCodecs make_cache_codecs(const ModelSpec& spec, const CacheEmulation& e);

}  // namespace m3::ref
