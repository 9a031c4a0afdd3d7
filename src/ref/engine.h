// The CPU reference backend: the whole MiniMax-M3 text model in fp32, exactly as
// shared/docs/m3-model.md says, over a paged KV / index-K cache. The oracle of every test.
#pragma once
#include <memory>

#include "model/weights.h"
#include "runtime/backend.h"

namespace m3::ref {

struct RefOptions {
  int num_cache_blocks = 256;  // blocks of spec.index_block tokens
  int threads = 0;             // 0 = hardware concurrency
};

std::unique_ptr<Backend> make_ref_backend(ModelSpec spec, ModelWeights weights, RefOptions opt = {});

}  // namespace m3::ref
