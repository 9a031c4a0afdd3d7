// Launcher of qk_norm_rope_cache_work: 8 warps per item, one (token, vector) per warp, one
// instantiation per (K/V cache dtype, index-K cache dtype).
#include <cmath>

#include "kernels/qk_norm_rope_cache.cuh"
#include "native/cuda_check.h"
#include "native/launch.cuh"
#include "native/qk_norm_rope.h"

namespace m3::native {

std::vector<float> rope_inv_freq(int rotary_dim, double theta) {
  M3_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary_dim must be positive and even, got {}", rotary_dim);
  std::vector<float> f(size_t(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    float e = float(2 * i) / float(rotary_dim);
    float pw = float(std::pow(double(float(theta)), double(e)));
    f[size_t(i)] = 1.0f / pw;
  }
  return f;
}

DeviceRope::DeviceRope(int rotary_dim, double theta) : rotary_dim_(rotary_dim) {
  auto f = rope_inv_freq(rotary_dim, theta);
  M3_CUDA_CHECK(cudaMalloc(&inv_freq_, f.size() * sizeof(float)));
  M3_CUDA_CHECK(cudaMemcpy(inv_freq_, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
}

DeviceRope::~DeviceRope() { cudaFree(inv_freq_); }

QkNormRopeArgs qk_norm_rope_args(const ModelSpec& spec, int layer) {
  M3_CHECK(layer >= 0 && layer < spec.num_layers, "qk_norm_rope: layer {} out of range [0, {})", layer, spec.num_layers);
  QkNormRopeArgs a;
  a.num_heads = spec.num_heads;
  a.kv_heads = spec.num_kv_heads;
  a.head_dim = spec.head_dim;
  a.index_heads = spec.sparse(layer) ? spec.index_heads : 0;
  a.index_dim = spec.sparse(layer) ? spec.index_dim : 0;
  a.rotary_dim = spec.rotary_dim;
  a.eps = spec.rms_eps;
  a.proj_stride = int64_t(spec.q_dim()) + 2 * spec.kv_dim() + int64_t(a.index_heads) * a.index_dim +
                  (a.index_heads > 0 ? a.index_dim : 0);
  return a;
}

kernels::QkNormRopeCacheParams make_qk_norm_rope_params(const QkNormRopeArgs& a, const StepMetadataView& meta,
                                                       const KvLayerView& cache) {
  const bool sparse = a.index_heads > 0;
  M3_CHECK(a.num_heads > 0 && a.kv_heads > 0, "qk_norm_rope: heads {} / kv_heads {} must be > 0", a.num_heads,
           a.kv_heads);
  M3_CHECK(a.head_dim > 0 && a.head_dim <= kernels::kRopeMaxDim, "qk_norm_rope: head_dim {} outside (0, {}]",
           a.head_dim, kernels::kRopeMaxDim);
  M3_CHECK(a.rotary_dim > 0 && a.rotary_dim % 2 == 0 && a.rotary_dim <= a.head_dim,
           "qk_norm_rope: rotary_dim {} must be even and in (0, head_dim {}]", a.rotary_dim, a.head_dim);
  M3_CHECK(cache.kv_heads == a.kv_heads && cache.head_dim == a.head_dim,
           "qk_norm_rope: cache has {} kv heads x {} dims, layer has {} x {}", cache.kv_heads, cache.head_dim,
           a.kv_heads, a.head_dim);
  int64_t width = int64_t(a.num_heads + 2 * a.kv_heads) * a.head_dim +
                  (sparse ? int64_t(a.index_heads + 1) * a.index_dim : 0);
  M3_CHECK(a.proj_stride >= width, "qk_norm_rope: proj_stride {} below the fused row width {}", a.proj_stride, width);
  M3_CHECK(a.proj && a.q_norm && a.k_norm && a.inv_freq && a.q_out, "qk_norm_rope: a required pointer is null");
  M3_CHECK(cache.k && cache.v, "qk_norm_rope: cache K/V pointers are null");
  if (sparse) {
    M3_CHECK(a.index_dim > 0 && a.index_dim <= kernels::kRopeMaxDim && a.rotary_dim <= a.index_dim,
             "qk_norm_rope: index_dim {} must be in [rotary_dim {}, {}]", a.index_dim, a.rotary_dim, kernels::kRopeMaxDim);
    M3_CHECK(cache.ik && cache.index_dim == a.index_dim,
             "qk_norm_rope: sparse layer needs an index-K cache of dim {} (cache has {}, pointer {})", a.index_dim,
             cache.index_dim, cache.ik ? "set" : "null");
    M3_CHECK(a.iq_norm && a.ik_norm && a.iq_out, "qk_norm_rope: sparse layer needs iq/ik norms and iq_out");
  }
  kernels::QkNormRopeCacheParams p;
  p.proj = a.proj;
  p.proj_stride = a.proj_stride;
  p.num_tokens = meta.num_tokens;
  p.num_heads = a.num_heads;
  p.kv_heads = a.kv_heads;
  p.head_dim = a.head_dim;
  p.index_heads = a.index_heads;
  p.index_dim = a.index_dim;
  p.rotary_dim = a.rotary_dim;
  p.eps = a.eps;
  p.q_norm = a.q_norm;
  p.k_norm = a.k_norm;
  p.iq_norm = a.iq_norm;
  p.ik_norm = a.ik_norm;
  p.inv_freq = a.inv_freq;
  p.positions = meta.positions;
  p.slots = meta.slots;
  p.q_out = a.q_out;
  p.iq_out = a.iq_out;
  p.k_cache = cache.k;
  p.v_cache = cache.v;
  p.ik_cache = cache.ik;
  p.k_inv_scale = 1.0f / cache.k_scale;
  p.v_inv_scale = 1.0f / cache.v_scale;
  p.ik_inv_scale = 1.0f / cache.ik_scale;
  const bool kv8 = cache.kv_dtype == DType::F8_E4M3, ik8 = cache.ik_dtype == DType::F8_E4M3;
  M3_CHECK(kv8 || cache.kv_dtype == DType::BF16, "qk_norm_rope: K/V cache dtype {} unsupported",
           dtype_name(cache.kv_dtype));
  M3_CHECK(ik8 || cache.ik_dtype == DType::BF16, "qk_norm_rope: index-K cache dtype {} unsupported",
           dtype_name(cache.ik_dtype));
  p.kv_fmt = kv8 ? kernels::CacheFmt::FP8 : kernels::CacheFmt::BF16;
  p.ik_fmt = ik8 ? kernels::CacheFmt::FP8 : kernels::CacheFmt::BF16;
  M3_CHECK(p.num_work() < (int64_t(1) << 31), "qk_norm_rope: {} tokens x {} vectors exceed the 2^31 work items",
           p.num_tokens, p.vectors_per_token());
  return p;
}

void launch(const kernels::QkNormRopeCacheParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  using kernels::CacheBf16;
  using kernels::CacheFp8;
  using kernels::CacheFmt;
  using kernels::QkNormRopeCacheOp;
  const kernels::WorkShape sh = kernels::qk_norm_rope_cache_shape(p);
  const bool kv8 = p.kv_fmt == CacheFmt::FP8, ik8 = p.ik_fmt == CacheFmt::FP8;
  if (kv8 && ik8) launch_op<QkNormRopeCacheOp<CacheFp8, CacheFp8>>(p, sh, stream, "qk_norm_rope_cache", opt);
  else if (kv8) launch_op<QkNormRopeCacheOp<CacheFp8, CacheBf16>>(p, sh, stream, "qk_norm_rope_cache", opt);
  else if (ik8) launch_op<QkNormRopeCacheOp<CacheBf16, CacheFp8>>(p, sh, stream, "qk_norm_rope_cache", opt);
  else launch_op<QkNormRopeCacheOp<CacheBf16, CacheBf16>>(p, sh, stream, "qk_norm_rope_cache", opt);
}

void qk_norm_rope_cache(const QkNormRopeArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                        cudaStream_t stream) {
  launch(make_qk_norm_rope_params(a, meta, cache), stream);
}

}  // namespace m3::native
