// ForwardModel (native/forward_model.h).
#include "native/forward_model.h"

#include <algorithm>

#include "core/codecs.h"
#include "native/attention.h"
#include "native/cuda_check.h"

namespace m3::native {

namespace {
constexpr int kMaxAttnChunks = 256;  // chunk states per row (the combine's shared memory)
int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }
ModelSpec rank_spec_of(const std::shared_ptr<const PreparedWeights>& w, const DeviceComm* comm) {
  M3_CHECK(w != nullptr, "forward: no prepared weights");
  return prepared_rank_spec(w->layout(), comm ? comm->rank() : 0, comm ? comm->size() : 1, "forward");
}
}  // namespace

ForwardModel::ForwardModel(std::shared_ptr<const PreparedWeights> weights, DeviceKvCache& cache, int max_model_len,
                           DeviceComm* comm)
    : w_(std::move(weights)),
      spec_(rank_spec_of(w_, comm)),
      comm_(comm),
      cache_(&cache),
      rope_(spec_.rotary_dim, spec_.rope_theta),
      max_model_len_(max_model_len),
      sms_(device_sm_count()) {
  M3_CHECK(max_model_len_ > 0, "forward: max_model_len {} must be > 0", max_model_len_);
  // q/k (and index q/k) norm weights as fp32 device vectors (the rope kernel reads fp32; the
  // conversion from the arena's bf16 is exact).
  const PreparedLayout& L = w_->layout();
  auto reader = w_->reader();
  std::vector<float> host;
  std::vector<std::array<int64_t, 4>> at(size_t(spec_.num_layers));
  auto add = [&](const PTensor& t) -> int64_t {
    if (t.empty()) return -1;
    std::vector<uint16_t> b(size_t(t.cols));
    reader(t.offset, uint64_t(t.cols) * 2, b.data());
    const int64_t off = int64_t(host.size());
    for (uint16_t v : b) host.push_back(bf16_to_f32(v));
    host.resize(size_t(round4(int64_t(host.size()))), 0.f);
    return off;
  };
  for (int l = 0; l < spec_.num_layers; ++l) {
    const auto& Y = L.layers[size_t(l)];
    at[size_t(l)] = {add(Y.q_norm), add(Y.k_norm), add(Y.iq_norm), add(Y.ik_norm)};
  }
  norm_f32_ = DevBuf(std::max<size_t>(host.size(), 4) * 4);
  M3_CUDA_CHECK(cudaMemcpy(norm_f32_.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  for (int l = 0; l < spec_.num_layers; ++l) {
    LayerViews v;
    v.qkv = w_->qkv(l);
    v.o = w_->o(l);
    v.norms = w_->norms(l);
    if (spec_.moe(l)) {
      v.moe = w_->moe(l);
    } else {
      v.gate_up = w_->dense_gate_up(l);
      v.down = w_->dense_down(l);
    }
    for (int k = 0; k < 4; ++k)
      v.qk_norms[size_t(k)] = at[size_t(l)][size_t(k)] < 0 ? nullptr : norm_f32_.get<float>() + at[size_t(l)][size_t(k)];
    layers_.push_back(v);
  }
  // Attention chunk sizes: fixed per backend from max_model_len (at most kMaxAttnChunks chunks per
  // row), so a row's attention bits never depend on the batch (kernels/attention.cuh).
  for (bool sparse : {false, true}) {
    const int tiles = attention_max_tiles(sparse, spec_.index_topk, spec_.index_block, max_model_len_);
    tiles_per_chunk_[sparse] = std::max(kDefaultTilesPerChunk, (tiles + kMaxAttnChunks - 1) / kMaxAttnChunks);
  }
  int first = spec_.num_layers;
  while (first > 0 && spec_.sparse(first - 1) && spec_.moe(first - 1)) --first;
  sparse_range_ = LayerRange{first, spec_.num_layers};
}

}  // namespace m3::native
