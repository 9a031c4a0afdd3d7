// The declarative weight table: every tensor the MiniMax-M3 text model needs, listed once with the
// checkpoint name(s) it may have, the shape and checkpoint dtype the ModelSpec implies, how it
// would be split across tensor-parallel ranks, and where it goes (role, layer, expert). Loaders
// for the CPU reference (model/load_weights.cpp) and for prepared GPU weights walk the same table.
// Binding a table to a checkpoint checks both ends: a listed tensor that is missing is an error,
// and so is a tensor in the files that nothing claims, except the vision tower, the projector,
// the patch-merge MLP and mtp tensors, which are claimed explicitly as ignored.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/safetensors.h"
#include "model/spec.h"

namespace m3 {

enum class WeightRole : uint8_t {
  Embed, LmHead, FinalNorm,                       // whole model
  InputNorm, PostNorm,                            // per layer
  Wq, Wk, Wv, Wo, QNorm, KNorm,                   // attention
  IndexWq, IndexWk, IndexQNorm, IndexKNorm,       // MSA indexer (sparse layers)
  DenseGate, DenseUp, DenseDown,                  // dense MLP layers
  Router, RouterBias,                             // MoE routing (fp32 in the checkpoint)
  ExpertGate, ExpertUp, ExpertDown,               // routed expert `expert`: w1, w3, w2
  SharedGate, SharedUp, SharedDown,               // shared expert
};
std::string_view weight_role_name(WeightRole r);

// How tensor parallelism would split the tensor: by output rows (dim 0), by input columns
// (dim 1), or not at all. A recommendation recorded with the tensor; the loaders of this file
// load whole tensors.
enum class ShardDim : uint8_t { Replicated, Rows, Cols };

struct WeightEntry {
  std::vector<std::string> names;  // accepted checkpoint names, full (with prefix); names[0] is the released one
  WeightRole role;
  int layer = -1;                  // -1 for whole-model tensors
  int expert = -1;                 // routed expert index, else -1
  std::vector<int64_t> shape;      // [out, in] for matrices, [n] for vectors
  DType dtype = DType::BF16;       // dtype in the released checkpoint
  ShardDim shard = ShardDim::Replicated;
  bool matrix() const { return shape.size() == 2; }
  std::string describe() const;    // "layer 3 Wq [512, 256] BF16"
};

struct WeightTable {
  std::string prefix;              // text-model prefix ("language_model." in the released layout)
  std::vector<WeightEntry> entries;
};

// Every tensor `spec` needs. prefix: see detect_text_prefix.
WeightTable build_weight_table(const ModelSpec& spec, const std::string& prefix = "language_model.");

// The prefix the checkpoint's text tensors use: "language_model." (released layout) or "" (a
// bare text checkpoint), found by looking for the embedding table.
std::string detect_text_prefix(const SafetensorsSet& files);

// True for tensors a text engine ignores on purpose: vision tower, multi-modal projector,
// patch-merge MLP, and multi-token-prediction (a name component "mtp" or "mtp_*").
bool is_ignored_tensor(std::string_view name);

// Dtypes a table entry loads from: BF16, F16, F32, or F8_E4M3 with a U8 E8M0 companion
// "<name minus .weight>.weight_scale_inv" of shape [rows, ceil(cols / 32)] (MXFP8, matrices only).
struct BoundWeight {
  const WeightEntry* entry = nullptr;
  const TensorView* tensor = nullptr;
  const TensorView* scale = nullptr;  // MXFP8 companion, else null
};
// The binding owns its table (BoundWeight::entry points into it; moving keeps those pointers,
// copying is disabled); its tensor views point into `files`, which must outlive it.
struct WeightBinding {
  WeightTable table;
  std::vector<BoundWeight> weights;   // one per table entry, in table order
  std::vector<std::string> ignored;   // file tensors claimed as ignored (sorted)
  WeightBinding() = default;
  WeightBinding(WeightBinding&&) = default;
  WeightBinding& operator=(WeightBinding&&) = default;
  WeightBinding(const WeightBinding&) = delete;
  WeightBinding& operator=(const WeightBinding&) = delete;
};

// Matches the table against the files. Throws m3::Error naming the tensor (and file) for: a
// missing tensor, two spellings of one weight both present, a wrong shape, an unsupported dtype,
// a malformed MXFP8 scale, and any file tensor left unclaimed.
WeightBinding bind_weights(WeightTable table, const SafetensorsSet& files);

// Converts one bound tensor to fp32 (n = its element count) into dst.
void convert_to_f32(const BoundWeight& w, float* dst);

}  // namespace m3
