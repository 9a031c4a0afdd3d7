// Native launcher of the fused q/k norm + partial RoPE + cache insert (kernels/qk_norm_rope_cache.cuh):
// reads each token's fused projection row [q | k | v | iq | ik] (fp32), writes normed + rotated q
// and iq rows for the attention and indexer kernels, and inserts k, v and ik into the layer's
// paged caches at the token's slot (slot -1 rows write nothing).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/qk_norm_rope_params.h"
#include "model/spec.h"
#include "native/kv_cache.h"
#include "native/launch.h"
#include "native/step_metadata.h"

namespace m3::native {

// fp32 inverse frequencies of the partial RoPE, built exactly as ref::Rope builds them
// (1 / fp32(theta ** (2i / rotary_dim))), so host and device angles are the same fp32 numbers.
std::vector<float> rope_inv_freq(int rotary_dim, double theta);

// Device copy of rope_inv_freq().
class DeviceRope {
 public:
  DeviceRope(int rotary_dim, double theta);
  ~DeviceRope();
  DeviceRope(const DeviceRope&) = delete;
  DeviceRope& operator=(const DeviceRope&) = delete;
  int rotary_dim() const { return rotary_dim_; }
  const float* inv_freq() const { return inv_freq_; }

 private:
  int rotary_dim_;
  float* inv_freq_ = nullptr;
};

struct QkNormRopeArgs {
  const float* proj = nullptr;  // [T, proj_stride] fp32: q [H*D] | k [KV*D] | v [KV*D] | iq [IH*ID] | ik [ID]
  int64_t proj_stride = 0;      // floats between rows (>= the fused width)
  int num_heads = 0, kv_heads = 0, head_dim = 0;
  int index_heads = 0, index_dim = 0;  // index_heads = 0 on full-attention layers
  int rotary_dim = 0;
  float eps = 1e-6f;
  const float* q_norm = nullptr;   // [D] device, fp32
  const float* k_norm = nullptr;   // [D]
  const float* iq_norm = nullptr;  // [ID] (sparse layers)
  const float* ik_norm = nullptr;  // [ID]
  const float* inv_freq = nullptr; // [rotary_dim / 2] (DeviceRope)
  float* q_out = nullptr;          // [T, H*D]
  float* iq_out = nullptr;         // [T, IH*ID] (sparse layers)
};

// The head layout of a model layer (T rows come from `meta`).
QkNormRopeArgs qk_norm_rope_args(const ModelSpec& spec, int layer);

// The params over meta.num_tokens rows, with every check against the cache (head counts, dims,
// dtypes); a refusal names the op and what is wrong.
kernels::QkNormRopeCacheParams make_qk_norm_rope_params(const QkNormRopeArgs& a, const StepMetadataView& meta,
                                                       const KvLayerView& cache);
void launch(const kernels::QkNormRopeCacheParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
// make + launch.
void qk_norm_rope_cache(const QkNormRopeArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                        cudaStream_t stream);

}  // namespace m3::native
