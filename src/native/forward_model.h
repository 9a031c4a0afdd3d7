// What a forward plan reads besides its activations: the typed views of every layer's prepared
// weights, the q/k norm weights as fp32 device vectors, the RoPE frequencies, the paged caches,
// and the numerics constants of this backend (attention chunk sizes, fixed from max_model_len so a
// row's bits never depend on the batch). Built once per backend; borrowed views only.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "native/dev_buf.h"
#include "native/device_comm.h"
#include "native/kv_cache.h"
#include "native/prepared.h"
#include "native/qk_norm_rope.h"

namespace m3::native {

struct LayerViews {
  Fp8Weight qkv, o;                     // fused q|k|v|iq|ik, O projection
  LayerNormWeights norms;
  MoeWeights moe;                       // MoE layers
  DenseWeight gate_up, down;            // dense-MLP layers
  std::array<const float*, 4> qk_norms{};  // q, k, iq, ik (fp32 device; iq / ik null on dense layers)
};

// A contiguous run of layers [first, last).
struct LayerRange {
  int first = 0, last = 0;
  bool empty() const { return last <= first; }
  bool contains(int l) const { return l >= first && l < last; }
};

class ForwardModel {
 public:
  // comm: this rank's collectives when the plans run tensor-parallel (the weights are then the
  // arena of rank comm->rank() of comm->size(); a comm of one rank runs the collectives too, as
  // copies); null for the single-rank forward.
  ForwardModel(std::shared_ptr<const PreparedWeights> weights, DeviceKvCache& cache, int max_model_len,
               DeviceComm* comm = nullptr);
  ForwardModel(const ForwardModel&) = delete;
  ForwardModel& operator=(const ForwardModel&) = delete;

  // The shapes this rank computes with (model/tp_shard.h tp_rank_spec; the model's at one rank).
  const ModelSpec& spec() const { return spec_; }
  DeviceComm* comm() const { return comm_; }
  const PreparedWeights& weights() const { return *w_; }
  const std::shared_ptr<const PreparedWeights>& weights_ptr() const { return w_; }
  DeviceKvCache& cache() const { return *cache_; }
  const LayerViews& layer(int l) const { return layers_[size_t(l)]; }
  const DeviceRope& rope() const { return rope_; }
  int max_model_len() const { return max_model_len_; }
  int sms() const { return sms_; }
  // 32-key tiles per attention chunk of dense (false) and sparse (true) layers (kernels/attention.cuh).
  int tiles_per_chunk(bool sparse) const { return tiles_per_chunk_[sparse ? 1 : 0]; }
  // The sparse MoE layers that end the model (MiniMax-M3: 3 .. 59): the range a LayerRangeRunner
  // (native/layer_range.h) may run instead of the plan. Empty when the last layer is not one.
  LayerRange sparse_range() const { return sparse_range_; }

 private:
  std::shared_ptr<const PreparedWeights> w_;
  ModelSpec spec_;
  DeviceComm* comm_ = nullptr;
  DeviceKvCache* cache_;
  std::vector<LayerViews> layers_;
  DeviceRope rope_;
  DevBuf norm_f32_;
  int max_model_len_ = 0, sms_ = 0;
  int tiles_per_chunk_[2] = {0, 0};
  LayerRange sparse_range_;
};

}  // namespace m3::native
