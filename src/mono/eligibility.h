// What mono serves (plain C++; CPU-tested). Static refusals are decided once, when a runtime is
// created, each naming the layer, the tensor and what is wrong; per-step rules are decided for
// every step (a refused step runs natively and counts its reason; a later step is asked again).
// Mono reads the prepared weights and caches native loaded, never a copy: a format it does not
// run is a refusal, never a conversion.
#pragma once
#include <string>
#include <vector>

#include "model/prepare.h"
#include "runtime/backend.h"

namespace m3::mono {

struct CacheFormat {  // what the paged caches hold (native/kv_cache.h)
  DType kv = DType::F8_E4M3, ik = DType::F8_E4M3;
  int block_size = 0;
};

// Every reason mono cannot run the sparse range [first, last) of this arena and caches ("" none).
std::vector<std::string> static_refusals(const PreparedLayout& L, const CacheFormat& cache, int first, int last);

// The largest steps mono serves: 4 request rows (padded to a power of two, as native's decode
// buckets) of up to 4 query tokens each (a decode token, or a speculative verify row of 2 .. 4), so
// at most 16 token rows: the plans of those buckets use ops mono has codes for (mono/op_code.h).
constexpr int kMaxRows = 4, kMaxQueryLen = 4;

struct StepRules {
  int max_rows = kMaxRows;            // padded request rows
  int max_query_len = kMaxQueryLen;   // query tokens per row: 1 (decode), 2 .. 4 (verify rows)
};

// "" when mono runs this step, else the refusal reason (a metrics label): "prefill" (a row with
// more query tokens than max_query_len), "uneven_query" (rows of different query lengths: the
// backend runs only uniform ones as a bucket),
// "batch_too_large", "traced".
std::string step_refusal(const StepBatch& batch, const StepRules& rules, bool traced = false);

}  // namespace m3::mono
