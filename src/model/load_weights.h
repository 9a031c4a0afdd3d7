// Loading a checkpoint's text-model tensors into host fp32 (for the CPU reference), through the
// declarative weight table (model/weight_table.h): every needed tensor must be present with the
// expected shape/dtype, and every tensor in the files must be claimed (or explicitly ignored).
#pragma once
#include <filesystem>

#include "model/spec.h"
#include "model/weights.h"

namespace m3 {

ModelWeights load_model_weights(const std::filesystem::path& model_dir, const ModelSpec& spec);

struct WeightEntry;  // model/weight_table.h

// Every matrix and vector of `spec` allocated at its size, zero-filled (what load_model_weights
// fills; also a starting point for tests that build weights in memory).
ModelWeights allocate_model_weights(const ModelSpec& spec);
// The fp32 storage of a weight-table entry inside `w` (allocated by allocate_model_weights),
// holding exactly the entry's element count, row-major as in the checkpoint.
float* host_destination(ModelWeights& w, const WeightEntry& e);

}  // namespace m3
