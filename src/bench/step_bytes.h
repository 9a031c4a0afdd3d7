// Byte and FLOP accounting of one benchmark step over the prepared weight store (model/prepare.h)
// and the paged caches, for one tensor-parallel rank (plan the layout of a shard_spec at tp 1, or
// of the model at tp_size K: same bytes but for the replicated embedding).
//
// What a step must read (its floor is these bytes over the measured HBM bandwidth):
//   weights: every layer's fused q|k|v|iq|ik FP8 projection and O projection (codes + row scales),
//     norms, router (weight + bias), the routed experts HIT (w13 + w2 codes and E8M0 scales per
//     expert slot), the shared expert, dense MLPs; the embedding rows of the new tokens; lm_head.
//   caches, per row (one request per decode row, causal length L = context + 1):
//     sparse layers: the K and V of the selected blocks (min(L, (topk - 1) * block + the partial
//       local block) tokens) and the WHOLE index-K cache (L vectors);
//     full-attention layers: the K and V of all L tokens.
//   prefill of T tokens: caches counted once (T tokens of K, V and index-K), all experts hit by T tokens.
// Experts hit per MoE layer: by default the expected number of distinct experts when each of the
// step's tokens picks top_k distinct experts uniformly at random, E * (1 - (1 - k/E)^tokens)
// ("expected-random"); or given per layer (e.g. counted from the actual routing: "given").
// Activations, cache writes and metadata are not counted (a few KB per layer at decode).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_case.h"
#include "core/dtype.h"
#include "model/prepare.h"

namespace m3::bench {

struct StepBytesOptions {
  DType kv_dtype = DType::F8_E4M3;  // K/V cache elements
  DType ik_dtype = DType::F8_E4M3;  // index-K cache elements
  // Distinct routed experts read per layer (one entry per model layer, dense layers ignored);
  // empty = the expected-random model.
  std::vector<double> experts_hit;
};

// Expected distinct experts when `tokens` tokens each pick k distinct of E uniformly.
double expected_distinct_experts(int E, int k, int64_t tokens);

// Where bytes live: the prepared arena, or a layer's paged caches (tokens of one row's sequence).
enum class Space : uint8_t { Arena, KCache, VCache, IKCache };
struct Region {
  Space space = Space::Arena;
  int layer = -1;      // caches: model layer
  int row = -1;        // caches: decode row (request)
  int64_t begin = 0;   // Arena: byte offset; caches: first token of the row's sequence
  int64_t count = 0;   // Arena: bytes; caches: tokens
};

// One operation of the step in execution order, with its bytes and (for layer ops) its layer.
struct StepOp {
  std::string op;       // "embed", "qkv", "index_k", "kv", "o", "norms", "router", "experts",
                        // "shared_expert", "dense_mlp", "lm_head"
  int layer = -1;       // -1 for embed / final norm + lm_head
  double bytes = 0;     // by the accounting above (experts: expected count, may be fractional)
  double flops = 0;
  std::vector<Region> regions{};  // filled by step_ops(..., with_regions = true)
};

struct CacheBytes {  // per token of one row, per layer, this rank
  double kv = 0;     // one of K or V: kv_heads * head_dim * element size
  double ik = 0;     // index_dim * element size (sparse layers)
};
CacheBytes cache_bytes_per_token(const PreparedLayout& L, const StepBytesOptions& o);

// The ops of one step. with_regions: also the concrete regions a plain read of the step would
// stream (experts: the first round(hit) expert slots of a seeded random permutation per layer;
// sparse K/V: the last tokens of each row's sequence).
std::vector<StepOp> step_ops(const PreparedLayout& L, const BenchCase& c, const StepBytesOptions& o,
                             bool with_regions = false, uint64_t seed = 1);

// Totals by op name (in first-appearance order) and by kind.
struct OpTotal {
  std::string op;
  double bytes = 0, flops = 0;
  int count = 0;  // ops of this name in the step
};
struct StepBytes {
  std::vector<OpTotal> ops;
  double weights = 0, experts = 0, cache = 0, kv = 0, index_k = 0, lm_head = 0, total = 0;
  double flops = 0;
  double experts_hit_mean = 0;  // per MoE layer
  std::string expert_model;     // "expected-random" | "given"
};
StepBytes step_bytes(const PreparedLayout& L, const BenchCase& c, const StepBytesOptions& o);

}  // namespace m3::bench
