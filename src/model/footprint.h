// Byte accounting of the prepared weight formats (design.md, "Prepared weight formats") and the
// caches: parameter counts, bytes each decode token must read by component and precision, and
// cache bytes per context token. Computed by walking the weight table, so it covers exactly the
// tensors the loaders load. `info` prints it; the benchmarks divide it by measured bandwidth to
// get their floor.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/spec.h"

namespace m3 {

enum class WeightFormat : uint8_t {
  BF16,
  F32,
  FP8RowScaled,  // FP8 E4M3 + one fp32 scale per output row: rows * cols + 4 * rows bytes
  MXFP4,         // E2M1 pairs + one E8M0 per 32 inputs: 4.25 bits per weight
  MXFP8,         // E4M3 + one E8M0 per 32 inputs: 8.25 bits per weight
};
std::string_view weight_format_name(WeightFormat f);

struct FootprintOptions {
  int tp = 1;                 // tensor-parallel ranks: per-rank figures (sharded tensors divided by tp)
  bool router_bf16 = false;   // router weight stored BF16 instead of FP32 (bias stays FP32)
  int kv_bytes = 1;           // bytes per K/V cache element (1 = FP8 E4M3, 2 = BF16)
  int index_k_bytes = 1;      // bytes per index-K cache element (1 = FP8, 2 = BF16)
  bool mxfp8_projections = false;  // attention projections MXFP8 (PrepareOptions::mxfp8_projections)
  bool mxfp8_experts = false;      // routed and shared experts MXFP8 (PrepareOptions::mxfp8_experts)
};

struct FootprintItem {
  std::string component;      // "attention q/k/v + index projections", "routed experts", ...
  WeightFormat format;
  double params = 0;          // stored parameters (whole model)
  double params_per_token = 0;  // parameters a decode token reads (top-k experts, one embedding row)
  double bytes = 0;           // prepared bytes per rank
  double bytes_per_token = 0;   // prepared bytes a decode token reads per rank (batch 1)
};

struct Footprint {
  std::vector<FootprintItem> items;
  double total_params = 0;         // every text-model parameter
  double active_params = 0;        // read per token, without lm_head (one embedding row counted)
  double lm_head_params = 0;
  double weight_bytes = 0;         // prepared weights per rank
  double weight_bytes_per_token = 0;
  double kv_bytes_per_token = 0;       // K/V cache stored per context token per rank (all layers)
  double index_k_bytes_per_token = 0;  // index-K cache stored per context token per rank (sparse layers)
};

Footprint compute_footprint(const ModelSpec& spec, const FootprintOptions& opt = {});

// Cache bytes one decode step (batch 1) reads per rank at `context` tokens: the whole K/V of full
// layers, at most index_topk blocks of K/V per group on sparse layers, and the whole index-K
// cache of every sparse layer.
double cache_read_bytes_per_step(const ModelSpec& spec, const FootprintOptions& opt, int64_t context);

}  // namespace m3
