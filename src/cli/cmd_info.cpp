// `m3mono info (--model DIR | --config FILE | --preset NAME)`: the model's shape, layer plan,
// parameter counts (total, active per token) and the bytes a decode token reads per component in
// the prepared formats (model/footprint.h), cache bytes per context token and per step at a few
// context lengths. With --model, the checkpoint's tensors are also bound to the weight table
// (headers only), so a missing or unclaimed tensor is reported here.
#include <fmt/format.h>

#include <map>

#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "core/check.h"
#include "model/footprint.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/prepare.h"
#include "model/weight_table.h"

namespace m3::cli {
namespace {

struct InfoArgs {
  std::string model, config, preset;
  int tp = 1;
  bool kv_bf16 = false, index_bf16 = false, router_bf16 = false;
  std::vector<int64_t> contexts{4096, 32768, 131072};
};

std::string human(double v, const char* unit) {  // decimal prefixes
  const char* p[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  return fmt::format("{:.{}f} {}{}", v, v < 10 ? 2 : (v < 100 ? 1 : 0), p[i], unit);
}
std::string params(double v) {
  if (v >= 1e9) return fmt::format("{:.2f} B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} K", v / 1e3);
  return fmt::format("{:.0f}", v);
}

void print_plan(const ModelSpec& s) {
  std::printf("layer plan:\n");
  int l = 0;
  while (l < s.num_layers) {
    int e = l;
    while (e + 1 < s.num_layers && s.attn[size_t(e + 1)] == s.attn[size_t(l)] && s.mlp[size_t(e + 1)] == s.mlp[size_t(l)])
      ++e;
    std::string range = l == e ? fmt::format("{}", l) : fmt::format("{}-{}", l, e);
    std::printf("  %-8s %s + %s\n", range.c_str(), s.sparse(l) ? "sparse attention (MSA)" : "full attention",
                s.moe(l) ? "MoE" : "dense MLP");
    l = e + 1;
  }
}

int run_info(const InfoArgs& a) {
  int sources = !a.model.empty() + !a.config.empty() + !a.preset.empty();
  M3_CHECK(sources == 1, "info: give exactly one of --model, --config, --preset");
  ModelSpec s;
  std::string origin;
  if (!a.model.empty()) {
    s = load_model_spec(a.model);
    origin = a.model;
  } else if (!a.config.empty()) {
    s = load_model_spec(a.config);
    origin = a.config;
  } else {
    s = synthetic_preset(a.preset);
    origin = "preset " + a.preset;
  }

  std::printf("%s\n", fmt::format("model: {}", origin).c_str());
  std::printf("%s\n", fmt::format("  vocab {}, hidden {}, {} layers; heads {} q / {} kv x {}, rotary {} (theta {:g}), "
                                  "eps {:g}", s.vocab_size, s.hidden, s.num_layers, s.num_heads, s.num_kv_heads,
                                  s.head_dim, s.rotary_dim, s.rope_theta, s.rms_eps).c_str());
  if (s.num_moe_layers() > 0)
    std::printf("%s\n", fmt::format("  experts {} x {} (top-{}, scale {:g}), shared {}; swiglu alpha {:g} limit {:g}",
                                    s.num_experts, s.moe_inter, s.top_k, s.routed_scale, s.shared_inter,
                                    s.swiglu_alpha, s.swiglu_limit).c_str());
  if (s.num_moe_layers() < s.num_layers)
    std::printf("%s\n", fmt::format("  dense MLP {}", s.dense_inter).c_str());
  if (s.num_sparse_layers() > 0)
    std::printf("%s\n", fmt::format("  indexer {} x {}, block {}, top-{} blocks, {} local (window {} tokens)",
                                    s.index_heads, s.index_dim, s.index_block, s.index_topk, s.index_local,
                                    s.index_topk * s.index_block).c_str());
  print_plan(s);

  bool mxfp8_projections = false, mxfp8_experts = false;  // the GPU arena's formats for this checkpoint
  if (!a.model.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(fs::path(a.model) / "model.safetensors", ec) ||
        fs::exists(fs::path(a.model) / "model.safetensors.index.json", ec)) {
      SafetensorsSet files = SafetensorsSet::open(a.model);
      WeightBinding b = bind_weights(build_checkpoint_table(s, files, a.model), files);
      std::printf("%s\n", fmt::format("checkpoint: {} tensors in {} file(s); {} claimed by the weight table, {} "
                                      "ignored (vision/projector/mtp)", files.size(), files.files().size(),
                                      files.size() - b.ignored.size(), b.ignored.size()).c_str());
      // the formats the files hold, as quantization_config declares them (bytes as stored)
      std::map<std::string, std::pair<int, double>> by_format;
      for (const auto& w : b.weights) {
        auto& [n, bytes] = by_format[std::string(weight_quant_name(w.quant))];
        ++n;
        bytes += double(w.tensor->nbytes) + (w.scale ? double(w.scale->nbytes) : 0.0);
      }
      std::string formats;
      for (const auto& [f, nb] : by_format)
        formats += fmt::format("{}{} {} ({})", formats.empty() ? "" : ", ", nb.first, f, human(nb.second, "B"));
      std::printf("%s\n", fmt::format("checkpoint formats: quantization_config {}; tensors {}", b.table.quant.describe(),
                                      formats).c_str());
      const PrepareOptions arena = prepare_options_for(b, PrepareOptions{});
      mxfp8_projections = arena.mxfp8_projections;
      mxfp8_experts = arena.mxfp8_experts;
      if (const std::string note = arena_requantization_note(b, arena); !note.empty())
        std::printf("%s\n", fmt::format("note: {}", note).c_str());
    }
  }

  FootprintOptions fo;
  fo.tp = a.tp;
  fo.kv_bytes = a.kv_bf16 ? 2 : 1;
  fo.index_k_bytes = a.index_bf16 ? 2 : 1;
  fo.router_bf16 = a.router_bf16;
  fo.mxfp8_projections = mxfp8_projections;
  fo.mxfp8_experts = mxfp8_experts;
  Footprint fp = compute_footprint(s, fo);
  std::printf("%s\n", fmt::format("parameters: total {}; active per token {} (+{} lm_head)", params(fp.total_params),
                                  params(fp.active_params), params(fp.lm_head_params)).c_str());
  std::printf("%s\n", fmt::format("prepared weights, per rank of tp {}: {} stored; read per decode token (batch 1):",
                                  a.tp, human(fp.weight_bytes, "B")).c_str());
  if (a.tp > 1) {  // the GPU arena's own split rules (whole MXFP4 blocks per rank, heads)
    PrepareOptions po;
    po.tp_size = a.tp;
    po.mxfp8_projections = mxfp8_projections;
    po.mxfp8_experts = mxfp8_experts;
    try {
      const PreparedLayout L = plan_prepared(s, po);
      std::printf("%s\n", fmt::format("  per rank: {} query heads, {} KV head(s){}", L.heads, L.kv_heads,
                                      s.num_kv_heads < a.tp ? " (replicated: the ranks of one KV head share it)" : "")
                             .c_str());
    } catch (const Error& e) {
      std::printf("%s\n", fmt::format("note: the GPU paths cannot split this model over {} ranks: {}", a.tp, e.what())
                             .c_str());
    }
  }
  std::printf("  %-38s %-27s %12s %12s %12s\n", "component", "format", "params/token", "bytes/token", "stored");
  for (const auto& it : fp.items)
    std::printf("  %-38s %-27s %12s %12s %12s\n", it.component.c_str(), std::string(weight_format_name(it.format)).c_str(),
                params(it.params_per_token).c_str(), human(it.bytes_per_token, "B").c_str(),
                human(it.bytes, "B").c_str());
  std::printf("  %-38s %-27s %12s %12s %12s\n", "total", "", "", human(fp.weight_bytes_per_token, "B").c_str(),
              human(fp.weight_bytes, "B").c_str());
  std::printf("%s\n", fmt::format("cache per context token, per rank: K/V {} ({}), index-K {} ({})",
                                  human(fp.kv_bytes_per_token, "B"), fo.kv_bytes == 1 ? "fp8" : "bf16",
                                  human(fp.index_k_bytes_per_token, "B"), fo.index_k_bytes == 1 ? "fp8" : "bf16")
                          .c_str());
  for (int64_t c : a.contexts) {
    double cache = cache_read_bytes_per_step(s, fo, c);
    std::printf("%s\n", fmt::format("  decode step at context {}: cache read {}, total read {}", c, human(cache, "B"),
                                    human(cache + fp.weight_bytes_per_token, "B")).c_str());
  }
  return 0;
}

RunFn setup_info(CLI::App& app) {
  auto a = std::make_shared<InfoArgs>();
  app.add_option("--model", a->model, "checkpoint directory (config.json [+ safetensors])");
  app.add_option("--config", a->config, "a config.json file (spec only)");
  std::string names;
  for (const auto& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--preset", a->preset, "a named shape (spec only): " + names);
  app.add_option("--tp", a->tp, "tensor-parallel ranks (per-rank figures)")->capture_default_str();
  app.add_option("--context", a->contexts, "context lengths for the per-step cache read");
  app.add_flag("--kv-bf16", a->kv_bf16, "K/V cache in BF16 instead of FP8");
  app.add_flag("--index-bf16", a->index_bf16, "index-K cache in BF16 instead of FP8");
  app.add_flag("--router-bf16", a->router_bf16, "router weight in BF16 instead of FP32");
  return [a] { return run_info(*a); };
}

M3_COMMAND("info", "model shape, layer plan, parameter counts and bytes read per decode token", setup_info, 70);

}  // namespace
}  // namespace m3::cli
