// What one benchmark case is (decode rows at a context length, or a prefill of T tokens) and the
// model shapes a benchmark runs at: one tensor-parallel rank's shapes (shard_spec) and a cut to
// the last N layers (last_layers). Plain host code: the CPU smoke mode and the CUDA harness share it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/spec.h"

namespace m3::bench {

struct BenchCase {
  int batch = 1;         // decode rows (one request each); 1 for a prefill case
  int64_t context = 0;   // decode: tokens already cached per row (the new tokens start at this position)
  int64_t prefill = 0;   // > 0: one request of `prefill` new tokens at positions [0, prefill)
  int query = 1;         // decode: new tokens per row (1; 2 .. 4: a speculative verify step)
  bool is_prefill() const { return prefill > 0; }
  int64_t tokens() const { return is_prefill() ? prefill : int64_t(batch) * query; }  // new tokens of the step
  int64_t max_len() const { return is_prefill() ? prefill : context + query; }  // longest causal length
  std::string mode() const { return is_prefill() ? "prefill" : "decode"; }
  std::string label() const;  // "decode b=4 ctx=8K" / "prefill T=8K"
};

// "8K" -> 8192, "64k" -> 65536, "1M" -> 1048576, "100" -> 100 (binary suffixes). Errors name `what`.
int64_t parse_count(std::string_view s, std::string_view what);
// Comma-separated counts: "1,2,4" or "1K,8K".
std::vector<int64_t> parse_count_list(std::string_view s, std::string_view what);
std::string format_count(int64_t v);  // 8192 -> "8K", 1000 -> "1000"

// Decode cases (every context x query length x batch), then prefill cases (every T), in that order.
// Query lengths 1 .. 4 (2 .. 4: verify steps of that many tokens a row).
std::vector<BenchCase> make_cases(const std::vector<int64_t>& batches, const std::vector<int64_t>& contexts,
                                  const std::vector<int64_t>& prefills, const std::vector<int64_t>& queries = {1});

// One rank's shapes out of k: query / KV / index heads, expert, shared and dense widths and the
// vocabulary divided by k (each must divide; errors name the field). The index-K projection stays
// whole (one vector per token that every rank needs). k == 1 returns the spec unchanged.
ModelSpec shard_spec(const ModelSpec& spec, int k);

// The last n layers of the layer plan (so a small n keeps the common sparse + MoE layer; the whole
// model is n = num_layers). n must be in [1, num_layers].
ModelSpec last_layers(const ModelSpec& spec, int n);

}  // namespace m3::bench
