// Checkpoint -> host fp32 ModelWeights, through the weight table: open the safetensors (one file
// or shards), bind every table entry (both ends checked), then convert each tensor into the slot
// the entry names.
#include "model/load_weights.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace m3 {

namespace {
MlpWeights mlp(int inter, int hidden) {
  MlpWeights m;
  m.gate = Mat(inter, hidden);
  m.up = Mat(inter, hidden);
  m.down = Mat(hidden, inter);
  return m;
}
}  // namespace

ModelWeights allocate_model_weights(const ModelSpec& s) {
  s.validate();
  ModelWeights w;
  const int H = s.hidden;
  w.embed = Mat(s.vocab_size, H);
  w.lm_head = Mat(s.vocab_size, H);
  w.final_norm.assign(size_t(H), 0.f);
  w.layers.resize(size_t(s.num_layers));
  for (int l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    L.input_norm.assign(size_t(H), 0.f);
    L.post_norm.assign(size_t(H), 0.f);
    L.wq = Mat(s.q_dim(), H);
    L.wk = Mat(s.kv_dim(), H);
    L.wv = Mat(s.kv_dim(), H);
    L.wo = Mat(H, s.q_dim());
    L.q_norm.assign(size_t(s.head_dim), 0.f);
    L.k_norm.assign(size_t(s.head_dim), 0.f);
    if (s.sparse(l)) {
      L.wiq = Mat(s.index_heads * s.index_dim, H);
      L.wik = Mat(s.index_dim, H);
      L.iq_norm.assign(size_t(s.index_dim), 0.f);
      L.ik_norm.assign(size_t(s.index_dim), 0.f);
    }
    if (!s.moe(l)) {
      L.dense = mlp(s.dense_inter, H);
      continue;
    }
    L.router = Mat(s.num_experts, H);
    L.router_bias.assign(size_t(s.num_experts), 0.f);
    L.experts.reserve(size_t(s.num_experts));
    for (int e = 0; e < s.num_experts; ++e) L.experts.push_back(mlp(s.moe_inter, H));
    if (s.shared_inter > 0) L.shared = mlp(s.shared_inter, H);
  }
  return w;
}

float* host_destination(ModelWeights& w, const WeightEntry& e) {
  auto layer = [&]() -> LayerWeights& {
    M3_CHECK(e.layer >= 0 && size_t(e.layer) < w.layers.size(), "weight {}: layer {} out of range", e.describe(),
             e.layer);
    return w.layers[size_t(e.layer)];
  };
  auto expert = [&]() -> MlpWeights& {
    auto& L = layer();
    M3_CHECK(e.expert >= 0 && size_t(e.expert) < L.experts.size(), "weight {}: expert {} out of range", e.describe(),
             e.expert);
    return L.experts[size_t(e.expert)];
  };
  float* p = nullptr;
  size_t n = 0;
  auto mat = [&](Mat& m) { p = m.data.data(); n = m.data.size(); };
  auto vec = [&](Vec& v) { p = v.data(); n = v.size(); };
  switch (e.role) {
    case WeightRole::Embed: mat(w.embed); break;
    case WeightRole::LmHead: mat(w.lm_head); break;
    case WeightRole::FinalNorm: vec(w.final_norm); break;
    case WeightRole::InputNorm: vec(layer().input_norm); break;
    case WeightRole::PostNorm: vec(layer().post_norm); break;
    case WeightRole::Wq: mat(layer().wq); break;
    case WeightRole::Wk: mat(layer().wk); break;
    case WeightRole::Wv: mat(layer().wv); break;
    case WeightRole::Wo: mat(layer().wo); break;
    case WeightRole::QNorm: vec(layer().q_norm); break;
    case WeightRole::KNorm: vec(layer().k_norm); break;
    case WeightRole::IndexWq: mat(layer().wiq); break;
    case WeightRole::IndexWk: mat(layer().wik); break;
    case WeightRole::IndexQNorm: vec(layer().iq_norm); break;
    case WeightRole::IndexKNorm: vec(layer().ik_norm); break;
    case WeightRole::DenseGate: mat(layer().dense.gate); break;
    case WeightRole::DenseUp: mat(layer().dense.up); break;
    case WeightRole::DenseDown: mat(layer().dense.down); break;
    case WeightRole::Router: mat(layer().router); break;
    case WeightRole::RouterBias: vec(layer().router_bias); break;
    case WeightRole::ExpertGate: mat(expert().gate); break;
    case WeightRole::ExpertUp: mat(expert().up); break;
    case WeightRole::ExpertDown: mat(expert().down); break;
    case WeightRole::SharedGate: mat(layer().shared.gate); break;
    case WeightRole::SharedUp: mat(layer().shared.up); break;
    case WeightRole::SharedDown: mat(layer().shared.down); break;
  }
  size_t want = 1;
  for (auto d : e.shape) want *= size_t(d);
  M3_CHECK(p && n == want, "weight {}: destination holds {} values, the entry has {} (weights not allocated for this "
           "spec?)", e.describe(), n, want);
  return p;
}

ModelWeights load_model_weights(const std::filesystem::path& model_dir, const ModelSpec& spec) {
  SafetensorsSet files = SafetensorsSet::open(model_dir);
  WeightBinding binding = bind_weights(build_weight_table(spec, detect_text_prefix(files)), files);
  ModelWeights w = allocate_model_weights(spec);
  std::vector<float*> dst;
  dst.reserve(binding.weights.size());
  for (const auto& b : binding.weights) dst.push_back(host_destination(w, *b.entry));

  // Conversion is independent per tensor; spread it over the cores (each tensor written by one).
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < binding.weights.size();) {
      try {
        convert_to_f32(binding.weights[i], dst[i]);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu);
        if (!err) err = std::current_exception();
      }
    }
  };
  unsigned nt = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < nt; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (err) std::rethrow_exception(err);
  return w;
}

}  // namespace m3
