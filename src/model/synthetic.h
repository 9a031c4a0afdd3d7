// Synthetic MiniMax-M3 checkpoints: named shape presets and a deterministic random generator that
// writes config.json + model.safetensors in the released layout (bf16 weights, fp32 router weight
// and correction bias, a few vision-tower / projector / patch-merge tensors that a text loader
// must ignore). Values are a pure function of (seed, tensor name, element index), so the same
// numbers can also be produced in memory (synthetic_weights) without touching a file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/spec.h"
#include "model/weights.h"

namespace m3 {

struct WeightEntry;

// Presets: "tiny" (the shape of the tiny-m3-a fixture), "small" (hidden 512, 6 layers, vocab
// 4096), "real-heads" (the released attention geometry: 64 q / 4 kv heads of 128, index 4 x 128,
// block 128, hidden 1024, 1 full + 4 sparse layers, small experts and vocab) and "real" (the
// released MiniMax-M3 text model; spec only, far too large to write).
std::vector<std::string> synthetic_preset_names();
ModelSpec synthetic_preset(const std::string& name);  // throws listing the valid names
bool synthetic_preset_writable(const std::string& name);  // false for "real"

enum class DenseMlpSpelling { Mlp, BlockSparseMoe };  // mlp.{gate,up,down}_proj | block_sparse_moe.{..}_proj

// The weight layouts of the released checkpoints (m3-model.md), each with the quantization_config
// its release carries:
//   bf16            every matrix BF16 (router FP32): the BF16 release
//   mxfp8           every linear but lm_head and the router MXFP8 (F8_E4M3 + weight_scale_inv per 32)
//   mxfp4           routed and shared experts MXFP4 (Quark: packed E2M1 + weight_scale per 32),
//                   everything else as in bf16 (AMD's MiniMax-M3-MXFP4)
//   mxfp4-attn-fp8  mxfp4 plus the attention linears FP8 per tensor (weight_scale and a static
//                   input_scale) (MiniMax-M3-MXFP4-AttnFP8)
// The values written are the generator's values quantized; synthetic_values returns them
// dequantized (what a loader reads back).
enum class SyntheticFormat { Bf16, Mxfp8, Mxfp4, Mxfp4AttnFp8 };
std::vector<std::string> synthetic_format_names();
SyntheticFormat parse_synthetic_format(const std::string& name);  // throws listing the valid names
std::string_view synthetic_format_name(SyntheticFormat f);

struct SyntheticOptions {
  uint64_t seed = 1;
  float weight_std = 0.06f;  // matrices, router, embeddings (transformers' initializer_range)
  float norm_std = 0.2f;     // Gemma norms store w of (1 + w): small, non-zero
  float bias_std = 0.05f;    // e_score_correction_bias
  bool vision = true;        // add a few vision / projector / patch-merge tensors
  bool mtp = false;          // add an mtp.* tensor
  DenseMlpSpelling dense_spelling = DenseMlpSpelling::Mlp;
  ConfigSpelling config_spelling = ConfigSpelling::Released;
  SyntheticFormat format = SyntheticFormat::Bf16;
  int shards = 1;            // > 1: model-0000i-of-0000N.safetensors + model.safetensors.index.json
  std::function<void(uint64_t done, uint64_t total)> progress;  // bytes of model.safetensors
};

// The values of one weight-table entry (fp32, already rounded to the entry's checkpoint dtype).
void synthetic_values(const WeightEntry& e, const SyntheticOptions& opt, float* out);

// What load_model_weights returns for a checkpoint written by write_synthetic_checkpoint with
// the same spec and options.
ModelWeights synthetic_weights(const ModelSpec& spec, const SyntheticOptions& opt = {});

// Writes dir/config.json and dir/model.safetensors, or opt.shards shard files and their index
// (creating dir). Returns the tensor bytes written.
uint64_t write_synthetic_checkpoint(const std::filesystem::path& dir, const ModelSpec& spec,
                                    const SyntheticOptions& opt = {});

}  // namespace m3
