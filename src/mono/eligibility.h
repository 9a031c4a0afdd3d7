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

struct StepRules {
  int max_rows = 4;       // padded request rows
  int max_query_len = 1;  // query tokens per row: 1 (decode); verify rows of 2 .. 4 once served
};

// "" when mono runs this step, else the refusal reason (a metrics label): "prefill" (a row with
// more query tokens than max_query_len), "uneven_query" (rows of different lengths),
// "batch_too_large", "traced".
std::string step_refusal(const StepBatch& batch, const StepRules& rules, bool traced = false);

}  // namespace m3::mono
