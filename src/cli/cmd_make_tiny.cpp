// `m3mono make-tiny --out DIR [--seed N] [--preset NAME] [--format bf16|mxfp8|mxfp4|mxfp4-attn-fp8]`: writes a synthetic checkpoint in the
// released layout (config.json + model.safetensors) that the loader accepts; see
// model/synthetic.h for the presets and what the files hold. A tokenizer.json in M3's layout,
// sized to the preset's vocabulary, goes with it (text/tiny_tokenizer.h), and an M3-style
// chat_template.jinja over its markers (text/tiny_chat_template.h). --eagle3 adds a synthetic EAGLE3
// draft for it in DIR/eagle3 (model/synthetic_eagle3.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include <chrono>
#include <cstdio>

#include "cli/command.h"

#include "core/check.h"
#include "model/synthetic.h"
#include "model/synthetic_eagle3.h"
#include "text/tiny_files.h"

namespace m3::cli {
namespace {

struct MakeTinyArgs {
  std::string out;
  std::string preset = "tiny";
  uint64_t seed = 1;
  bool normalized = false;
  bool block_sparse_moe = false;
  bool mtp = false;
  bool no_vision = false;
  int shards = 1;
  std::string format = "bf16";
  bool eagle3 = false, eagle3_reduced = false;
};

RunFn setup_make_tiny(CLI::App& app) {
  auto a = std::make_shared<MakeTinyArgs>();
  app.add_option("--out", a->out, "output directory (created)")->required();
  std::string names;
  for (const auto& n : synthetic_preset_names())
    if (synthetic_preset_writable(n)) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--preset", a->preset, "shape preset: " + names)->capture_default_str();
  app.add_option("--seed", a->seed, "random seed of the weights")->capture_default_str();
  app.add_flag("--normalized-config", a->normalized, "write config.json in the transformers (normalized) spelling");
  app.add_flag("--block-sparse-moe-dense", a->block_sparse_moe,
               "name dense MLP tensors block_sparse_moe.*_proj (as transformers writes) instead of mlp.*");
  app.add_flag("--mtp", a->mtp, "add an mtp.* tensor (ignored by the loader)");
  app.add_flag("--no-vision", a->no_vision, "omit the vision / projector / patch-merge tensors");
  std::string formats;
  for (const auto& n : synthetic_format_names()) formats += (formats.empty() ? "" : ", ") + n;
  app.add_option("--format", a->format,
                 "weight layout of a release: " + formats +
                     " (bf16: every matrix BF16; mxfp8: every linear but lm_head and the router MXFP8, as the "
                     "official MXFP8 release; mxfp4: the experts MXFP4 in AMD Quark's layout; mxfp4-attn-fp8: "
                     "that plus FP8 per-tensor attention); config.json carries the release's quantization_config")
      ->capture_default_str();
  app.add_option("--shards", a->shards, "write N shard files + model.safetensors.index.json")->capture_default_str();
  app.add_flag("--eagle3", a->eagle3,
               "also write a synthetic EAGLE3 draft for it in OUT/eagle3 (random weights; shares the target's "
               "embedding and lm_head)");
  app.add_flag("--eagle3-reduced-vocab", a->eagle3_reduced,
               "with --eagle3: the draft has its own lm_head over every other token id and a d2t map");
  return [a]() -> int {
    ModelSpec spec = synthetic_preset(a->preset);
    if (!synthetic_preset_writable(a->preset)) {
      std::fprintf(stderr, "m3mono: preset '%s' is spec-only (use `m3mono info --preset %s`)\n", a->preset.c_str(),
                   a->preset.c_str());
      return 2;
    }
    SyntheticOptions opt;
    opt.seed = a->seed;
    opt.vision = !a->no_vision;
    opt.mtp = a->mtp;
    opt.shards = a->shards;
    opt.format = parse_synthetic_format(a->format);
    opt.config_spelling = a->normalized ? ConfigSpelling::Normalized : ConfigSpelling::Released;
    opt.dense_spelling = a->block_sparse_moe ? DenseMlpSpelling::BlockSparseMoe : DenseMlpSpelling::Mlp;
    auto t0 = std::chrono::steady_clock::now();
    int last_pct = -1;
    opt.progress = [&](uint64_t done, uint64_t total) {
      if (total < (uint64_t(32) << 20)) return;  // only large presets report progress
      int pct = int(100.0 * double(done) / double(total));
      if (pct / 10 != last_pct / 10 || done == total) {
        std::fprintf(stderr, "  writing tensors: %3d%% (%.0f / %.0f MB)\n", pct, double(done) / 1e6,
                     double(total) / 1e6);
        last_pct = pct;
      }
    };
    uint64_t bytes = write_synthetic_checkpoint(a->out, spec, opt);
    const std::string tokenizer_note = text::write_tiny_text_files(a->out, spec.vocab_size, spec.bos_id, spec.eos_id);
    M3_CHECK(a->eagle3 || !a->eagle3_reduced, "make-tiny: --eagle3-reduced-vocab goes with --eagle3");
    std::string draft_note;
    if (a->eagle3) {
      SyntheticEagle3Options eo;
      eo.seed = a->seed;
      eo.reduced_vocab = a->eagle3_reduced;
      const Eagle3Spec d = write_synthetic_eagle3(std::filesystem::path(a->out) / "eagle3", spec, eo);
      draft_note = fmt::format("; EAGLE3 draft in {}/eagle3 (hidden {}, {} heads, aux layers {}, draft vocab {})",
                               a->out, d.hidden, d.num_heads, fmt::join(d.aux_layers, ","), d.draft_vocab);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s\n", fmt::format("wrote {} (preset {}, format {}, seed {}): {} layers ({} sparse), hidden {}, "
                                    "vocab {}, {:.1f} MB of tensors in {:.1f} s{}",
                                    a->out, a->preset, a->format, a->seed, spec.num_layers, spec.num_sparse_layers(), spec.hidden,
                                    spec.vocab_size, double(bytes) / 1e6, secs, tokenizer_note + draft_note)
                            .c_str());
    return 0;
  };
}

M3_COMMAND("make-tiny",
           "write a synthetic MiniMax-M3 checkpoint (config.json + model.safetensors + tokenizer.json + "
           "chat_template.jinja)",
           setup_make_tiny,
           80);

}  // namespace
}  // namespace m3::cli
