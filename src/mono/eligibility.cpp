// static_refusals / step_refusal (mono/eligibility.h).
#include "mono/eligibility.h"

#include <fmt/format.h>

namespace m3::mono {

std::vector<std::string> static_refusals(const PreparedLayout& L, const CacheFormat& cache, int first, int last) {
  std::vector<std::string> r;
  const ModelSpec& s = L.spec;
  if (L.opt.tp_size != 1)
    r.push_back(fmt::format("tensor parallelism: rank {} of {} (mono serves one rank of 1 today)", L.opt.tp_rank,
                            L.opt.tp_size));
  if (first < 0 || last > s.num_layers || last <= first)
    r.push_back(fmt::format("layer range [{}, {}) of {} layers is empty or out of range", first, last, s.num_layers));
  if (cache.kv != DType::F8_E4M3 && cache.kv != DType::BF16)
    r.push_back(fmt::format("K/V cache dtype {} (FP8 E4M3 or BF16)", dtype_name(cache.kv)));
  if (cache.ik != DType::F8_E4M3 && cache.ik != DType::BF16)
    r.push_back(fmt::format("index-K cache dtype {} (FP8 E4M3 or BF16)", dtype_name(cache.ik)));
  if (cache.block_size != s.index_block)
    r.push_back(fmt::format("cache block size {} differs from the index block {}", cache.block_size, s.index_block));
  if (s.head_dim != 64 && s.head_dim != 128) r.push_back(fmt::format("head_dim {} (64 or 128)", s.head_dim));
  for (int l = std::max(first, 0); l < std::min(last, s.num_layers); ++l) {
    const PreparedLayerLayout& Y = L.layers[size_t(l)];
    auto bad = [&](const char* tensor, std::string what) {
      r.push_back(fmt::format("layer {} {}: {}", l, tensor, what));
    };
    if (!Y.sparse || !Y.moe) bad("layer", fmt::format("not a sparse MoE layer (sparse {}, moe {})", Y.sparse, Y.moe));
    // MXFP8 projections (a checkpoint's block scales as stored) run natively only
    for (auto [name, t] : {std::pair{"qkv", &Y.qkv}, std::pair{"o_proj", &Y.o}})
      if (t->mx())
        bad(name, "MXFP8 (E4M3 + E8M0 per 32 columns): mono's projection tasks read row-scaled FP8 only; native "
                  "serves it");
    if (!Y.qkv.mx() && (Y.qkv.codes.dtype != DType::F8_E4M3 || Y.qkv.scales.dtype != DType::F32))
      bad("qkv", fmt::format("{} with {} scales (FP8 E4M3 rows with fp32 row scales)", dtype_name(Y.qkv.codes.dtype),
                             dtype_name(Y.qkv.scales.dtype)));
    if (!Y.o.mx() && (Y.o.codes.dtype != DType::F8_E4M3 || Y.o.scales.dtype != DType::F32))
      bad("o_proj", fmt::format("{} with {} scales (FP8 E4M3 rows with fp32 row scales)", dtype_name(Y.o.codes.dtype),
                                dtype_name(Y.o.scales.dtype)));
    if (!Y.moe) continue;
    if (Y.router.dtype != DType::F32 && Y.router.dtype != DType::BF16)
      bad("router", fmt::format("{} (F32 or BF16)", dtype_name(Y.router.dtype)));
    for (auto [name, t] : {std::pair{"w13", &Y.w13}, std::pair{"w2", &Y.w2}})
      if (t->fp8())
        bad(name, "MXFP8 experts (E4M3 + E8M0 per 32): the mono kernel walks MXFP4 experts; native serves them");
      else if (t->codes.dtype != DType::E2M1x2 || t->scales.dtype != DType::E8M0)
        bad(name, fmt::format("{} with {} scales (MXFP4: E2M1 pairs, E8M0 per 32)", dtype_name(t->codes.dtype),
                              dtype_name(t->scales.dtype)));
    if (!Y.shared_in_slot)
      bad("shared expert", "not slot num_experts of the expert tensors (its width differs from the routed one)");
  }
  return r;
}

std::string step_refusal(const StepBatch& batch, const StepRules& rules, bool traced) {
  if (traced) return "traced";
  if (batch.seqs.empty()) return "empty";
  const size_t q = batch.seqs[0].tokens.size();
  for (const auto& s : batch.seqs) {
    if (int(s.tokens.size()) > rules.max_query_len) return "prefill";
    if (s.tokens.size() != q) return "uneven_query";
  }
  if (int(batch.seqs.size()) > rules.max_rows) return "batch_too_large";
  return "";
}

}  // namespace m3::mono
