// Checkpoint -> host fp32 ModelWeights, through the weight table: open the safetensors (one file
// or shards), bind every table entry (both ends checked), then convert each tensor into the slot
// the entry names.
#include "model/load_weights.h"

#include <fmt/format.h>

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

WeightSlot weight_slot(const ModelWeights& w, WeightRole role, int layer, int expert) {
  auto where = [&] {
    std::string s(weight_role_name(role));
    if (layer >= 0) s = fmt::format("layer {} {}", layer, s);
    if (expert >= 0) s += fmt::format(" expert {}", expert);
    return s;
  };
  auto L = [&]() -> const LayerWeights& {
    M3_CHECK(layer >= 0 && size_t(layer) < w.layers.size(), "weight {}: layer {} out of range (model has {})",
             where(), layer, w.layers.size());
    return w.layers[size_t(layer)];
  };
  auto X = [&]() -> const MlpWeights& {
    const auto& l = L();
    M3_CHECK(expert >= 0 && size_t(expert) < l.experts.size(), "weight {}: expert {} out of range (layer has {})",
             where(), expert, l.experts.size());
    return l.experts[size_t(expert)];
  };
  auto mat = [](const Mat& m) { return WeightSlot{m.data.data(), m.rows, m.cols}; };
  auto vec = [](const Vec& v) { return WeightSlot{v.data(), 1, int64_t(v.size())}; };
  switch (role) {
    case WeightRole::Embed: return mat(w.embed);
    case WeightRole::LmHead: return mat(w.lm_head);
    case WeightRole::FinalNorm: return vec(w.final_norm);
    case WeightRole::InputNorm: return vec(L().input_norm);
    case WeightRole::PostNorm: return vec(L().post_norm);
    case WeightRole::Wq: return mat(L().wq);
    case WeightRole::Wk: return mat(L().wk);
    case WeightRole::Wv: return mat(L().wv);
    case WeightRole::Wo: return mat(L().wo);
    case WeightRole::QNorm: return vec(L().q_norm);
    case WeightRole::KNorm: return vec(L().k_norm);
    case WeightRole::IndexWq: return mat(L().wiq);
    case WeightRole::IndexWk: return mat(L().wik);
    case WeightRole::IndexQNorm: return vec(L().iq_norm);
    case WeightRole::IndexKNorm: return vec(L().ik_norm);
    case WeightRole::DenseGate: return mat(L().dense.gate);
    case WeightRole::DenseUp: return mat(L().dense.up);
    case WeightRole::DenseDown: return mat(L().dense.down);
    case WeightRole::Router: return mat(L().router);
    case WeightRole::RouterBias: return vec(L().router_bias);
    case WeightRole::ExpertGate: return mat(X().gate);
    case WeightRole::ExpertUp: return mat(X().up);
    case WeightRole::ExpertDown: return mat(X().down);
    case WeightRole::SharedGate: return mat(L().shared.gate);
    case WeightRole::SharedUp: return mat(L().shared.up);
    case WeightRole::SharedDown: return mat(L().shared.down);
  }
  M3_FAIL("weight {}: unknown role {}", where(), int(role));
}

float* host_destination(ModelWeights& w, const WeightEntry& e) {
  WeightSlot slot = weight_slot(w, e.role, e.layer, e.expert);
  size_t want = 1;
  for (auto d : e.shape) want *= size_t(d);
  M3_CHECK(slot.data && slot.size() == want,
           "weight {}: destination holds {} values, the entry has {} (weights not allocated for this spec?)",
           e.describe(), slot.size(), want);
  return const_cast<float*>(slot.data);  // w is mutable here: the slot only came back const
}

ModelWeights load_model_weights(const std::filesystem::path& model_dir, const ModelSpec& spec) {
  SafetensorsSet files = SafetensorsSet::open(model_dir);
  WeightBinding binding = bind_weights(build_checkpoint_table(spec, files, model_dir), files);
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
