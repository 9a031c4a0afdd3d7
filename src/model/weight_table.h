// The declarative weight table: every tensor the MiniMax-M3 text model needs, listed once with the
// checkpoint name(s) it may have, the shape and checkpoint dtype the ModelSpec implies, how it
// would be split across tensor-parallel ranks, and where it goes (role, layer, expert). Loaders
// for the CPU reference (model/load_weights.cpp) and for prepared GPU weights walk the same table.
// Binding a table to a checkpoint checks both ends: a listed tensor that is missing is an error,
// and so is a tensor in the files that nothing claims, except the vision tower, the projector,
// the patch-merge MLP and mtp tensors, which are claimed explicitly as ignored.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/quant_config.h"
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
// The attention linears (q, k, v, o, index q / k) and the expert linears (routed and shared w1/w3/w2).
inline bool attention_linear(WeightRole r) {
  return r == WeightRole::Wq || r == WeightRole::Wk || r == WeightRole::Wv || r == WeightRole::Wo ||
         r == WeightRole::IndexWq || r == WeightRole::IndexWk;
}
inline bool expert_linear(WeightRole r) {
  return r == WeightRole::ExpertGate || r == WeightRole::ExpertUp || r == WeightRole::ExpertDown ||
         r == WeightRole::SharedGate || r == WeightRole::SharedUp || r == WeightRole::SharedDown;
}

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
  QuantConfig quant;               // what config.json's quantization_config declares (load_quant_config)
};

// Every tensor `spec` needs. prefix: see detect_text_prefix.
WeightTable build_weight_table(const ModelSpec& spec, const std::string& prefix = "language_model.");

// The table of a checkpoint directory: build_weight_table with the files' prefix and the
// quantization_config of model_dir/config.json.
WeightTable build_checkpoint_table(const ModelSpec& spec, const SafetensorsSet& files,
                                   const std::filesystem::path& model_dir);

// The prefix the checkpoint's text tensors use: "language_model." (released layout) or "" (a
// bare text checkpoint), found by looking for the embedding table.
std::string detect_text_prefix(const SafetensorsSet& files);

// True for tensors a text engine ignores on purpose: vision tower, multi-modal projector,
// patch-merge MLP, and multi-token-prediction (a name component "mtp" or "mtp_*").
bool is_ignored_tensor(std::string_view name);

// Formats a table entry loads from. Vectors and the embedding: BF16, F16, F32. Linear layers (every
// other matrix): what table.quant declares for the module (model/quant_config.h):
//   Float      BF16, F16 or F32, shape [rows, cols]
//   Mxfp8      F8_E4M3 [rows, cols] + U8 E8M0 "<module>.weight_scale_inv" (or ".weight_scale")
//              [rows, ceil(cols / 32)]
//   Mxfp4      U8 [rows, ceil(cols / 2)] (element 2j in the low nibble of byte j) + U8 E8M0
//              "<module>.weight_scale" (or "<module>.scale") [rows, ceil(cols / 32)]
//   Fp8Tensor  F8_E4M3 [rows, cols] + F32 "<module>.weight_scale" of one element; an F32
//              "<module>.input_scale" of one element may sit beside it (static activation
//              quantization, which this engine does not apply: claimed and not read)
// Without a quantization_config, F8_E4M3 with a weight_scale_inv companion is read as MXFP8.
struct BoundWeight {
  const WeightEntry* entry = nullptr;
  const TensorView* tensor = nullptr;
  const TensorView* scale = nullptr;  // the scale companion of a quantized format, else null
  WeightQuant quant = WeightQuant::Float;
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
// a format other than the one quantization_config declares (naming the rule that declared it),
// a missing or malformed scale, and any file tensor left unclaimed.
WeightBinding bind_weights(WeightTable table, const SafetensorsSet& files);

// Converts one bound tensor to fp32 (n = rows x cols of its table entry) into dst. Quantized
// formats dequantize exactly (E4M3 or E2M1 times a power of two, or times the F32 tensor scale).
// An E8M0 scale of 255 (NaN) is an error naming the tensor, the row and the block.
void convert_to_f32(const BoundWeight& w, float* dst);
// Rows [row0, row0 + nrows) and columns [col0, col0 + ncols) of one bound tensor, as fp32 (the
// same values as convert_to_f32), ncols per row into out.
void read_rows_f32(const BoundWeight& w, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, float* out);

}  // namespace m3
