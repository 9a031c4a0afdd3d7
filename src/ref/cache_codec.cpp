// CacheCodec: the GPU cache element codecs on the host (core/codecs.h, the functions the kernels
// call), applied where the reference writes its caches.
#include "ref/cache_codec.h"

#include <cmath>

#include "core/check.h"
#include "core/codecs.h"

namespace m3::ref {

CacheCodec CacheCodec::make(DType dtype, float scale) {
  M3_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F8_E4M3,
           "cache codec: dtype {} unsupported (F32, BF16 or F8_E4M3)", dtype_name(dtype));
  M3_CHECK(std::isfinite(scale) && scale > 0, "cache codec: scale must be finite and > 0, got {}", scale);
  M3_CHECK(dtype == DType::F8_E4M3 || scale == 1, "cache codec: a {} cache takes no scale (got {})", dtype_name(dtype),
           scale);
  CacheCodec c;
  c.dtype = dtype;
  c.scale = scale;
  c.inv_scale = 1.0f / scale;
  return c;
}

float CacheCodec::round(float x) const {
  switch (dtype) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    case DType::F8_E4M3: return e4m3_to_f32(f32_to_e4m3(x * inv_scale)) * scale;
    default: return x;
  }
}

void CacheCodec::store(const float* src, int64_t n, float* dst) const {
  for (int64_t i = 0; i < n; ++i) dst[i] = round(src[i]);
}

bool CacheCodecs::exact() const {
  for (const auto* v : {&k, &this->v, &ik})
    for (const CacheCodec& c : *v)
      if (!c.exact()) return false;
  return true;
}

CacheCodecs make_cache_codecs(const ModelSpec& spec, const CacheEmulation& e) {
  const size_t L = size_t(spec.num_layers);
  auto per_layer = [&](const std::vector<float>& v, float s, const char* what) {
    M3_CHECK(v.empty() || v.size() == L, "cache emulation: {} has {} entries for {} layers", what, v.size(), L);
    return v.empty() ? std::vector<float>(L, s) : v;
  };
  const auto ks = per_layer(e.k_scales, e.k_scale, "k_scales");
  const auto vs = per_layer(e.v_scales, e.v_scale, "v_scales");
  const auto is = per_layer(e.ik_scales, e.ik_scale, "ik_scales");
  CacheCodecs c;
  for (size_t l = 0; l < L; ++l) {
    c.k.push_back(CacheCodec::make(e.kv_dtype, ks[l]));
    c.v.push_back(CacheCodec::make(e.kv_dtype, vs[l]));
    c.ik.push_back(spec.sparse(int(l)) ? CacheCodec::make(e.ik_dtype, is[l]) : CacheCodec{});
  }
  return c;
}

}  // namespace m3::ref
