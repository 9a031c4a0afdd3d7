// Loading a checkpoint's text-model tensors into host fp32 (for the CPU reference), through the
// declarative weight table (model/weight_table.h): every needed tensor must be present with the
// expected shape/dtype, and every tensor in the files must be claimed (or explicitly ignored).
#pragma once
#include <filesystem>

#include "model/spec.h"
#include "model/weights.h"

namespace m3 {

ModelWeights load_model_weights(const std::filesystem::path& model_dir, const ModelSpec& spec);

}  // namespace m3
