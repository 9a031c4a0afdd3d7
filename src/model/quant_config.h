// The `quantization_config` of a checkpoint's config.json, typed: which weight format the
// checkpoint declares for each linear layer. The weight table binds every tensor against it
// (model/weight_table.cpp), so a file that holds a different format than its config declares is a
// load error naming both, instead of a guess from tensor names.
//
// Methods read (m3-model.md "Published quantized variants"; the releases' own configs):
//   none   no quantization_config: float tensors, or F8_E4M3 + weight_scale_inv (MXFP8) where the
//          files hold them (the layout before configs were read; kept for such checkpoints)
//   mxfp8  {"quant_method": "mxfp8", "weight_block_size": [1, 32], "modules_to_not_convert": [...]}
//          (also "ignored_layers" / "exclude"): every text linear F8_E4M3 [N, K] with a U8 E8M0
//          `weight_scale_inv` [N, K/32], a multiplier 2^(s - 127)
//   quark  {"quant_method": "quark", "global_quant_config": {"weight": {...}},
//          "layer_quant_config": {"<pattern>": {"weight": {...}}}, "exclude": [...]}: a linear takes
//          the first layer_quant_config pattern it matches, else the global config, unless excluded.
//          Weight specs understood: dtype "fp4" (or "fp4_e2m1"), qscheme "per_group", group_size 32
//          (OCP MXFP4: U8 [N, K/2], element 2j in the low nibble, U8 E8M0 `weight_scale` [N, K/32]);
//          dtype "fp8_e4m3", qscheme "per_tensor" (F8_E4M3 [N, K], F32 `weight_scale` of one element;
//          a static `input_scale` may sit beside it: activations are not quantized here, so it is
//          read past); dtype "fp8_e4m3", qscheme "per_group", group_size 32 (MXFP8, as above but
//          the scale named `weight_scale`).
// Patterns (exclude, modules_to_not_convert, layer_quant_config keys) match the module name (the
// tensor name without ".weight", prefix included) as a glob with * and ? over the whole name (as
// fnmatch), or as the plain name itself, which also matches any module whose name ends with "." +
// it ("lm_head" against "language_model.lm_head"). "re:" regular expressions are refused at parse
// time (a backtracking matcher on an untrusted pattern can take exponential time).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

// The format a linear layer's weight is stored in, as a config declares it.
enum class WeightQuant : uint8_t {
  Float,      // BF16 / F16 / F32 as the table lists
  Mxfp8,      // F8_E4M3 + E8M0 per 32 inputs
  Mxfp4,      // packed E2M1 pairs + E8M0 per 32 inputs
  Fp8Tensor,  // F8_E4M3 + one F32 scale for the tensor
};
std::string_view weight_quant_name(WeightQuant q);

enum class QuantMethod : uint8_t { None, Mxfp8, Quark };
std::string_view quant_method_name(QuantMethod m);

struct QuantRule {
  std::string pattern;  // as written in the config
  WeightQuant quant = WeightQuant::Float;
};

struct QuantConfig {
  QuantMethod method = QuantMethod::None;
  std::string origin = "config.json";  // for messages
  std::vector<std::string> exclude;    // modules left in float
  std::vector<QuantRule> layers;       // Quark layer_quant_config, in file order
  WeightQuant global = WeightQuant::Float;  // every other linear
  // What the config declares for linear `module` (tensor name without ".weight"); `why` (if not
  // null) receives the rule that decided it ("excluded by 'lm_head'", "global_quant_config", ...).
  WeightQuant expected(std::string_view module, std::string* why = nullptr) const;
  // "quark: fp4 per_group 32 (mxfp4) for linears, 1 layer rule, 3 exclusions"
  std::string describe() const;
};

// Does `pattern` (the forms in the header) match `module`?
bool quant_pattern_matches(std::string_view pattern, std::string_view module);

// From config.json text (top level, or under text_config). No quantization_config: method None.
// Errors (m3::Error) name the field and what it held: unknown quant_method, a weight spec this
// engine cannot read, a block size other than 32, a malformed pattern.
QuantConfig parse_quant_config(const std::string& json_text, const std::string& origin = "config.json");
// model_dir/config.json; a directory without one gives method None.
QuantConfig load_quant_config(const std::filesystem::path& model_dir);

}  // namespace m3
