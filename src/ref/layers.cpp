// RefLayers (ref/layers.h).
#include "ref/layers.h"

#include <cstring>

#include "core/check.h"
#include "ref/check_model.h"
#include "ref/linear.h"
#include "ref/norm.h"

namespace m3::ref {

RefLayers::RefLayers(const PreparedLayout& layout, BorrowedLayer model, std::vector<BorrowedLayer> layers,
                     int num_blocks, std::vector<float*> k, std::vector<float*> v, std::vector<float*> ik, int threads,
                     std::shared_ptr<Communicator> comm)
    : layout_(layout),
      spec_((check_ref_spec(layout.spec),
             prepared_rank_spec(layout, comm ? comm->rank() : 0, comm ? comm->size() : 1, "NativeLayers"))),
      comm_(std::move(comm)),
      model_(std::move(model)),
      layers_(std::move(layers)),
      pool_(threads),
      cache_(spec_, num_blocks, std::move(k), std::move(v), std::move(ik)),
      rope_(spec_.rotary_dim, spec_.rope_theta) {
  M3_CHECK(int(layers_.size()) == spec().num_layers, "NativeLayers: {} layers of tensors, the model has {}",
           layers_.size(), spec().num_layers);
  // the model's own tensors, dequantized once (the layers' are dequantized when they run)
  const ModelWeights m = dequantize_prepared_model_only(layout_, reader_of(model_));
  w_.embed = m.embed;
  w_.lm_head = m.lm_head;
  w_.final_norm = m.final_norm;
  w_.layers.resize(size_t(spec().num_layers));
}

ArenaReader RefLayers::reader_of(const BorrowedLayer& t) const {
  return [&t](uint64_t offset, uint64_t bytes, void* dst) {
    for (const auto& [s, data] : t)
      if (offset >= s.offset && offset + bytes <= s.offset + s.bytes) {
        std::memcpy(dst, static_cast<const uint8_t*>(data) + (offset - s.offset), bytes);
        return;
      }
    M3_FAIL("NativeLayers: no borrowed tensor holds arena bytes [{}, {})", offset, offset + bytes);
  };
}

void RefLayers::prepare_step(const StepBatch& batch) {
  plan_ = plan_step(spec(), cache_, batch);
  for (int t = 0; t < plan_.num_tokens; ++t) cache_.mark_written(plan_.slot[size_t(t)], plan_.pos[size_t(t)]);
  prepared_ = true;
}

std::vector<float> RefLayers::embed() const {
  M3_CHECK(prepared_, "NativeLayers: embed before prepare_step");
  const int H = spec().hidden;
  std::vector<float> x(size_t(plan_.num_tokens) * size_t(H));
  for (int t = 0; t < plan_.num_tokens; ++t)
    std::copy_n(w_.embed.row(plan_.token_id[size_t(t)]), H, x.data() + size_t(t) * H);
  return x;
}

void RefLayers::forward_layer(int l, float* x) {
  M3_CHECK(prepared_, "NativeLayers: forward_layer before prepare_step");
  M3_CHECK(l >= 0 && l < spec().num_layers, "NativeLayers: layer {} of {}", l, spec().num_layers);
  w_.layers[size_t(l)] = dequantize_prepared_layer(layout_, l, reader_of(layers_[size_t(l)]));
  const ForwardContext c{spec(), w_, cache_, rope_, pool_, nullptr, nullptr, nullptr, comm_.get()};
  attention_block(c, l, plan_, x);
  ffn_block(c, l, plan_.num_tokens, x);
  w_.layers[size_t(l)] = LayerWeights{};  // no copy kept
}

std::vector<float> RefLayers::logits(const float* x) {
  M3_CHECK(prepared_, "NativeLayers: logits before prepare_step");
  const int H = spec().hidden, R = int(plan_.out_tokens.size()), V = spec().vocab_size;
  std::vector<float> xn(size_t(R) * H), out(size_t(R) * size_t(V));
  for (int r = 0; r < R; ++r)
    gemma_rms_norm(x + size_t(plan_.out_tokens[size_t(r)]) * H, w_.final_norm.data(), H, spec().rms_eps,
                   xn.data() + size_t(r) * H);
  if (!comm_) {
    linear(w_.lm_head, xn.data(), H, R, out.data(), V, pool_);
    return out;
  }
  const int N = comm_->size(), Vr = w_.lm_head.rows;  // this rank's vocabulary rows, then every rank's
  M3_CHECK(Vr * N == V, "NativeLayers: lm_head has {} rows on each of {} ranks, vocab_size is {}", Vr, N, V);
  std::vector<float> mine(size_t(R) * size_t(Vr)), all(size_t(N) * mine.size());
  linear(w_.lm_head, xn.data(), H, R, mine.data(), Vr, pool_);
  comm_->all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < N; ++k)
      std::copy_n(all.data() + (size_t(k) * R + r) * Vr, Vr, out.data() + size_t(r) * V + size_t(k) * Vr);
  return out;
}

}  // namespace m3::ref
