// StepTraceRecorder (native/step_trace.h).
#include "native/step_trace.h"

#include <algorithm>

#include "core/codecs.h"
#include "native/cuda_backend.h"
#include "native/cuda_check.h"

namespace m3::native {

StepTraceRecorder::StepTraceRecorder(Forward& fw, SelectionTrace* sel, BlockScoreTrace* scores)
    : fw_(fw), sel_(sel), scores_(scores) {
  M3_CHECK(sel_ != nullptr, "step trace: no trace to record into");
}

void StepTraceRecorder::begin() {
  const ModelSpec& s = fw_.spec();
  sel_->clear();
  for (int l = 0; l < s.num_layers; ++l) {
    if (s.sparse(l)) sel_->layers.push_back(l);
    if (s.moe(l)) sel_->moe_layers.push_back(l);
  }
  sel_->blocks.resize(sel_->layers.size());
  sel_->experts.resize(sel_->moe_layers.size());
  if (sel_->record_cache) {
    sel_->cache_k.resize(size_t(s.num_layers));
    sel_->cache_v.resize(size_t(s.num_layers));
    sel_->cache_ik.resize(size_t(s.num_layers));
  }
  if (scores_) {
    scores_->layers = sel_->layers;
    scores_->scores.assign(sel_->layers.size(), {});
  }
}

void StepTraceRecorder::set_pass(int live_rows, const std::vector<int32_t>* positions,
                                 const std::vector<int32_t>* slots) {
  live_ = live_rows;
  positions_ = positions;
  slots_ = slots;
}

void StepTraceRecorder::after(const OpCall& op, cudaStream_t s) {
  switch (op.kind) {
    case OpKind::QkNormRopeCache:
    case OpKind::MmaRope:
      if (sel_->record_cache) record_cache(op.layer, s);
      break;
    case OpKind::IndexerTopk: {
      const auto& p = std::get<kernels::IndexerParams>(op.params);
      record_blocks({p.selected, p.block_scores, p.num_tokens, p.index_heads, p.topk, p.block_size, p.max_q_blocks},
                    op.layer, s);
      break;
    }
    case OpKind::AttentionSplit: {
      const auto& p = std::get<kernels::AttentionParams>(op.params);
      if (p.topk_scores)
        record_blocks({p.selected, p.topk_scores, p.num_tokens, p.kv_heads, p.topk, p.block_size, p.max_q_blocks},
                      op.layer, s);
      break;
    }
    case OpKind::RouterSelect: record_experts(std::get<kernels::RouterSelectParams>(op.params), op.layer, s); break;
    case OpKind::MoeRoute: record_experts(std::get<kernels::MoeRouteParams>(op.params).select, op.layer, s); break;
    case OpKind::RouterGemvRoute:
      record_experts(std::get<kernels::RouterGemvRouteParams>(op.params).route.select, op.layer, s);
      break;
    default: break;
  }
}

// The selected blocks (and, when asked, the block scores) of the live rows.
void StepTraceRecorder::record_blocks(const BlockLists& p, int layer, cudaStream_t s) {
  const ModelSpec& spec = fw_.spec();
  const int T = p.T, G = p.G, K = p.K, bs = p.bs, mqb = p.mqb;
  const auto& ls = sel_->layers;
  const size_t k = size_t(std::find(ls.begin(), ls.end(), layer) - ls.begin());
  M3_CHECK(k < ls.size() && G == spec.index_heads, "step trace: layer {} is not a sparse layer", layer);
  std::vector<int32_t> sel(size_t(T) * G * K);
  M3_CUDA_CHECK(cudaMemcpyAsync(sel.data(), p.selected, sel.size() * 4, cudaMemcpyDeviceToHost, s));
  std::vector<float> sc;
  if (scores_) {
    sc.resize(size_t(T) * G * size_t(mqb));
    M3_CUDA_CHECK(cudaMemcpyAsync(sc.data(), p.block_scores, sc.size() * 4, cudaMemcpyDeviceToHost, s));
  }
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  auto& dst = sel_->blocks[k];
  for (int t = 0; t < live_; ++t) {
    auto& row = dst.emplace_back(size_t(G));
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < K; ++j) {
        const int32_t b = sel[(size_t(t) * G + g) * K + j];
        if (b >= 0) row[size_t(g)].push_back(b);
      }
    if (scores_) {
      auto& srow = scores_->scores[k].emplace_back(size_t(G));
      const int nb = (*positions_)[size_t(t)] / bs + 1;
      for (int g = 0; g < G; ++g) {
        const float* b = sc.data() + (size_t(t) * G + g) * size_t(mqb);
        srow[size_t(g)].assign(b, b + nb);
      }
    }
  }
}

// The router's top-k (best first) of the live rows.
void StepTraceRecorder::record_experts(const kernels::RouterSelectParams& p, int layer, cudaStream_t s) {
  const auto& ml = sel_->moe_layers;
  const size_t k = size_t(std::find(ml.begin(), ml.end(), layer) - ml.begin());
  M3_CHECK(k < ml.size(), "step trace: layer {} is not a MoE layer", layer);
  const int K = p.K;
  std::vector<int32_t> ids(size_t(p.M) * K);
  M3_CUDA_CHECK(cudaMemcpyAsync(ids.data(), p.ids, ids.size() * 4, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  auto& dst = sel_->experts[k];
  for (int t = 0; t < live_; ++t) dst.emplace_back(ids.begin() + ptrdiff_t(t) * K, ids.begin() + ptrdiff_t(t + 1) * K);
}

// What the live rows' K, V (and index-K) entries of layer l read back as (decoded, times the
// scale): one copy per run of consecutive slots.
void StepTraceRecorder::record_cache(int l, cudaStream_t s) {
  const ModelSpec& spec = fw_.spec();
  const KvLayerView cv = fw_.model().cache().layer(l);
  const std::vector<int32_t>& slots = *slots_;
  auto copy = [&](const void* cache, DType dt, int width, float scale, std::vector<float>& dst) {
    const size_t eb = dtype_size(dt), row = size_t(width) * eb;
    std::vector<uint8_t> raw(size_t(live_) * row);
    for (int t = 0; t < live_;) {
      int e = t + 1;
      while (e < live_ && slots[size_t(e)] == slots[size_t(e - 1)] + 1) ++e;
      M3_CUDA_CHECK(cudaMemcpyAsync(raw.data() + size_t(t) * row,
                                    static_cast<const uint8_t*>(cache) + size_t(slots[size_t(t)]) * row,
                                    size_t(e - t) * row, cudaMemcpyDeviceToHost, s));
      t = e;
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < size_t(live_) * size_t(width); ++i)
      dst.push_back(dt == DType::F8_E4M3 ? e4m3_to_f32(raw[i]) * scale
                                          : bf16_to_f32(reinterpret_cast<const uint16_t*>(raw.data())[i]));
  };
  copy(cv.k, cv.kv_dtype, spec.kv_dim(), cv.k_scale, sel_->cache_k[size_t(l)]);
  copy(cv.v, cv.kv_dtype, spec.kv_dim(), cv.v_scale, sel_->cache_v[size_t(l)]);
  if (cv.ik) copy(cv.ik, cv.ik_dtype, spec.index_dim, cv.ik_scale, sel_->cache_ik[size_t(l)]);
}

}  // namespace m3::native
