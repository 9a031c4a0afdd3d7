// Loading a checkpoint's text-model tensors into host fp32 (for the CPU reference), through the
// declarative weight table (model/weight_table.h): every needed tensor must be present with the
// expected shape/dtype, and every tensor in the files must be claimed (or explicitly ignored).
#pragma once
#include <cstdint>
#include <filesystem>

#include "model/spec.h"
#include "model/weights.h"

namespace m3 {

ModelWeights load_model_weights(const std::filesystem::path& model_dir, const ModelSpec& spec);

struct WeightEntry;              // model/weight_table.h
enum class WeightRole : uint8_t;  // model/weight_table.h

// Where the weight of `role` (of `layer` and `expert`, -1 where they do not apply) lives inside
// `w`: the one mapping from weight-table roles to ModelWeights fields. A vector is one row.
// Throws naming the role, layer and expert when they are out of range for `w`.
struct WeightSlot {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t size() const { return size_t(rows) * size_t(cols); }
};
WeightSlot weight_slot(const ModelWeights& w, WeightRole role, int layer, int expert);

// Every matrix and vector of `spec` allocated at its size, zero-filled (what load_model_weights
// fills; also a starting point for tests that build weights in memory).
ModelWeights allocate_model_weights(const ModelSpec& spec);
// The fp32 storage of a weight-table entry inside `w` (allocated by allocate_model_weights),
// holding exactly the entry's element count, row-major as in the checkpoint.
float* host_destination(ModelWeights& w, const WeightEntry& e);

}  // namespace m3
