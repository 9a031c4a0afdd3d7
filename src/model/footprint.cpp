// Footprint: walks the weight table, assigns each tensor its prepared format and component, and
// sums parameters and bytes (whole tensor, and what one decode token reads).
#include "model/footprint.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/check.h"
#include "model/weight_table.h"

namespace m3 {

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F32: return "fp32";
    case WeightFormat::FP8RowScaled: return "fp8 e4m3 + fp32 row scale";
    case WeightFormat::MXFP4: return "mxfp4 (e2m1 + e8m0/32)";
    case WeightFormat::MXFP8: return "mxfp8 (e4m3 + e8m0/32)";
  }
  M3_FAIL("invalid weight format {}", int(f));
}

namespace {

struct Class {
  const char* component;
  WeightFormat format;
};

Class classify(WeightRole r, const FootprintOptions& o) {
  switch (r) {
    case WeightRole::Wq: case WeightRole::Wk: case WeightRole::Wv:
    case WeightRole::IndexWq: case WeightRole::IndexWk:
      return {"attention q/k/v + index projections", o.mxfp8_projections ? WeightFormat::MXFP8 : WeightFormat::FP8RowScaled};
    case WeightRole::Wo:
      return {"attention o projection", o.mxfp8_projections ? WeightFormat::MXFP8 : WeightFormat::FP8RowScaled};
    case WeightRole::ExpertGate: case WeightRole::ExpertUp: case WeightRole::ExpertDown:
      return {"routed experts", o.mxfp8_experts ? WeightFormat::MXFP8 : WeightFormat::MXFP4};
    case WeightRole::SharedGate: case WeightRole::SharedUp: case WeightRole::SharedDown:
      return {"shared expert", o.mxfp8_experts ? WeightFormat::MXFP8 : WeightFormat::MXFP4};
    case WeightRole::Router:
      return {"router", o.router_bf16 ? WeightFormat::BF16 : WeightFormat::F32};
    case WeightRole::RouterBias:
      return {"router", WeightFormat::F32};
    case WeightRole::DenseGate: case WeightRole::DenseUp: case WeightRole::DenseDown:
      return {"dense MLP", WeightFormat::BF16};
    case WeightRole::Embed:
      return {"embedding", WeightFormat::BF16};
    case WeightRole::LmHead:
      return {"lm_head", WeightFormat::BF16};
    default:
      return {"norms", WeightFormat::BF16};
  }
}

// Prepared bytes of a [rows, cols] (or [n]) tensor in format f.
double format_bytes(WeightFormat f, double rows, double cols) {
  switch (f) {
    case WeightFormat::BF16: return 2 * rows * cols;
    case WeightFormat::F32: return 4 * rows * cols;
    case WeightFormat::FP8RowScaled: return rows * cols + 4 * rows;
    case WeightFormat::MXFP4: return rows * cols / 2 + rows * std::ceil(cols / 32);
    case WeightFormat::MXFP8: return rows * cols + rows * std::ceil(cols / 32);
  }
  return 0;
}

}  // namespace

Footprint compute_footprint(const ModelSpec& spec, const FootprintOptions& opt) {
  M3_CHECK(opt.tp >= 1, "footprint: tp must be >= 1, got {}", opt.tp);
  M3_CHECK(opt.kv_bytes == 1 || opt.kv_bytes == 2, "footprint: kv_bytes must be 1 or 2, got {}", opt.kv_bytes);
  M3_CHECK(opt.index_k_bytes == 1 || opt.index_k_bytes == 2, "footprint: index_k_bytes must be 1 or 2, got {}",
           opt.index_k_bytes);
  WeightTable table = build_weight_table(spec);
  Footprint fp;
  std::map<std::pair<std::string, int>, size_t> slot;
  const double tp = opt.tp;
  for (const auto& e : table.entries) {
    Class c = classify(e.role, opt);
    double rows = double(e.shape[0]), cols = e.shape.size() > 1 ? double(e.shape[1]) : 1.0;
    double params = rows * cols;
    // rows of K/V (and index-q) heads split over min(tp, heads) ranks: replicated past the heads
    // (model/tp_shard.h: tp 8 over M3's 4 KV heads gives each rank one KV head)
    double split = tp;
    if (e.role == WeightRole::Wk || e.role == WeightRole::Wv) split = std::min(tp, double(spec.num_kv_heads));
    if (e.role == WeightRole::IndexWq) split = std::min(tp, double(spec.index_heads));
    if (e.shard == ShardDim::Rows) rows /= split;
    if (e.shard == ShardDim::Cols) cols /= split;
    double bytes = format_bytes(c.format, rows, cols);
    // What one decode token reads: the top-k routed experts (all experts are the same size, so
    // the first top_k stand for whichever are chosen) and one row of the embedding table.
    double frac = 1.0;
    if (e.role == WeightRole::ExpertGate || e.role == WeightRole::ExpertUp || e.role == WeightRole::ExpertDown)
      frac = e.expert < spec.top_k ? 1.0 : 0.0;
    if (e.role == WeightRole::Embed) frac = 1.0 / double(e.shape[0]);

    auto key = std::make_pair(std::string(c.component), int(c.format));
    auto it = slot.find(key);
    if (it == slot.end()) {
      it = slot.emplace(key, fp.items.size()).first;
      fp.items.push_back(FootprintItem{c.component, c.format});
    }
    FootprintItem& item = fp.items[it->second];
    item.params += params;
    item.params_per_token += params * frac;
    item.bytes += bytes;
    item.bytes_per_token += bytes * frac;

    fp.total_params += params;
    if (e.role == WeightRole::LmHead) fp.lm_head_params += params;
    else fp.active_params += params * frac;
  }
  for (const auto& it : fp.items) {
    fp.weight_bytes += it.bytes;
    fp.weight_bytes_per_token += it.bytes_per_token;
  }
  // K/V heads split across ranks (replicated when there are fewer heads than ranks); the one
  // index-K vector per token is needed by every rank.
  double kv_dim = double(spec.kv_dim()) / std::min(tp, double(spec.num_kv_heads));
  fp.kv_bytes_per_token = double(spec.num_layers) * 2 * kv_dim * opt.kv_bytes;
  fp.index_k_bytes_per_token = double(spec.num_sparse_layers()) * spec.index_dim * opt.index_k_bytes;
  return fp;
}

double cache_read_bytes_per_step(const ModelSpec& spec, const FootprintOptions& opt, int64_t context) {
  M3_CHECK(context >= 0, "footprint: context must be >= 0, got {}", context);
  double kv_dim = double(spec.kv_dim()) / std::min(double(opt.tp), double(spec.num_kv_heads));
  double per_tok_kv = 2 * kv_dim * opt.kv_bytes;
  double ctx = double(context);
  double window = std::min(ctx, double(spec.index_topk) * spec.index_block);
  double total = 0;
  for (int l = 0; l < spec.num_layers; ++l) {
    if (spec.sparse(l)) total += window * per_tok_kv + ctx * spec.index_dim * opt.index_k_bytes;
    else total += ctx * per_tok_kv;
  }
  return total;
}

}  // namespace m3
