// `m3mono router-probe --model DIR [--layers 3,20] [--prompt-ids 1,2,3 | --prompt-file F]
// [--tokens N] [--weight-tol X] [--end-to-end] [--json] [--threads N]`: how much rounding the
// router weight to BF16 changes the experts tokens pick (docs/router-probe.md).
//   default mode: the CPU reference (FP32 router) runs the prompt and N greedy tokens once,
//     capturing the rows entering each chosen MoE layer's router (ref/router_capture.h); on those
//     fixed rows the FP32 router is compared with its BF16-rounded twin (ref/router_probe.h).
//   --end-to-end: N greedy tokens with FP32 routers, then with BF16-rounded routers; the first
//     step whose token differs and the logits margin there (ref/router_end_to_end.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command.h"
#include "cli/int_list.h"
#include "cli/router_probe_report.h"
#include "core/check.h"
#include "model/load_weights.h"
#include "model/spec.h"
#include "ref/router_capture.h"
#include "ref/router_end_to_end.h"
#include "ref/router_probe.h"

namespace m3::cli {
namespace {

constexpr int kDefaultPromptLen = 40, kDefaultTokens = 16;

struct RouterProbeArgs {
  std::string model, layers, prompt_ids, prompt_file;
  int tokens = kDefaultTokens, threads = 0;
  double weight_tol = 1e-3;
  bool end_to_end = false, json = false;
  bool layers_given = false, ids_given = false, file_given = false;  // an empty value given is an error, not the default
};

// The built-in prompt: id_i = (1 + 37 i) mod vocab for i < 40.
std::vector<int32_t> default_prompt(int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < kDefaultPromptLen; ++i) p.push_back(int32_t((1 + 37 * int64_t(i)) % vocab));
  return p;
}

std::vector<int> moe_layers(const ModelSpec& s) {
  std::vector<int> out;
  for (int l = 0; l < s.num_layers; ++l)
    if (s.moe(l)) out.push_back(l);
  return out;
}

// --layers checked against the model: each a MoE layer, listed once. Empty: every MoE layer.
std::vector<int> chosen_layers(const std::string& flag, bool given, const ModelSpec& s) {
  const std::vector<int> moe = moe_layers(s);
  M3_CHECK(!moe.empty(), "router-probe: the model has no MoE layer, so no router to probe");
  if (!given) return moe;
  std::vector<int> out;
  for (long long v : parse_int_list(flag, "router-probe: --layers")) {
    M3_CHECK(v >= 0 && v < s.num_layers, "router-probe: --layers entry {} is not a layer of the model (layers 0-{})", v,
             s.num_layers - 1);
    M3_CHECK(s.moe(int(v)), "router-probe: --layers entry {} is a dense layer (no router); the MoE layers are {}", v,
             fmt::join(moe, ","));
    M3_CHECK(std::find(out.begin(), out.end(), int(v)) == out.end(), "router-probe: --layers lists layer {} twice", v);
    out.push_back(int(v));
  }
  return out;
}

std::vector<int32_t> chosen_prompt(const RouterProbeArgs& a, const ModelSpec& s) {
  std::vector<int32_t> p;
  std::string what = "--prompt-ids";
  if (a.ids_given) p = parse_token_ids(a.prompt_ids, "router-probe: --prompt-ids");
  else if (a.file_given) {
    p = read_token_id_file(a.prompt_file, "router-probe: --prompt-file");
    what = "--prompt-file '" + a.prompt_file + "'";
  } else
    return default_prompt(s.vocab_size);
  for (size_t i = 0; i < p.size(); ++i)
    M3_CHECK(p[i] < s.vocab_size, "router-probe: {} entry {} ({}) is outside the vocabulary [0, {})", what, i, p[i],
             s.vocab_size);
  return p;
}

// Progress on stderr: a run's first and last step, and at most one line a second in between.
std::function<void(int, int)> progress(std::string what) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [what = std::move(what), last](int step, int steps) {
    const auto now = std::chrono::steady_clock::now();
    if (step != 1 && step != steps && now - *last < std::chrono::seconds(1)) return;
    *last = now;
    std::fprintf(stderr, "router-probe: %s: step %d/%d%s\n", what.c_str(), step, steps, step == 1 ? " (prefill)" : "");
  };
}

int run_router_probe(const RouterProbeArgs& a) {
  std::error_code ec;
  M3_CHECK(std::filesystem::is_directory(a.model, ec), "router-probe: --model '{}' is not a directory", a.model);
  M3_CHECK(a.threads >= 0, "router-probe: --threads must be >= 0, got {}", a.threads);
  M3_CHECK(std::isfinite(a.weight_tol) && a.weight_tol > 0, "router-probe: --weight-tol must be > 0, got {}",
           a.weight_tol);
  M3_CHECK(a.tokens >= (a.end_to_end ? 1 : 0), "router-probe: --tokens must be >= {}{}, got {}", a.end_to_end ? 1 : 0,
           a.end_to_end ? " with --end-to-end" : "", a.tokens);
  M3_CHECK(std::filesystem::is_regular_file(std::filesystem::path(a.model) / "config.json", ec),
           "router-probe: --model '{}' has no config.json", a.model);
  ModelSpec spec = load_model_spec(a.model);
  const std::vector<int> layers = chosen_layers(a.layers, a.layers_given, spec);
  const std::vector<int32_t> prompt = chosen_prompt(a, spec);
  // fixed mode feeds prompt + tokens positions; end-to-end feeds prompt + tokens - 1
  const int64_t positions = int64_t(prompt.size()) + a.tokens - (a.end_to_end ? 1 : 0);
  M3_CHECK(spec.max_positions <= 0 || positions <= spec.max_positions,
           "router-probe: {} prompt tokens + --tokens {} exceed max_position_embeddings {}", prompt.size(), a.tokens,
           spec.max_positions);

  std::fprintf(stderr, "router-probe: %s, layers %s, %zu prompt tokens, %d tokens\n", a.model.c_str(),
               fmt::format("{}", fmt::join(layers, ",")).c_str(), prompt.size(), a.tokens);
  if (a.end_to_end) {
    ref::EndToEndOptions eo;
    eo.threads = a.threads;
    eo.progress = [pa = progress("run A, FP32 routers"), pb = progress("run B, BF16 routers")](char run, int s, int n) {
      (run == 'A' ? pa : pb)(s, n);
    };
    auto load = [&] {
      std::fprintf(stderr, "router-probe: loading the weights\n");
      return load_model_weights(a.model, spec);
    };
    EndToEndReport r{a.model, int(prompt.size()), layers, ref::router_end_to_end(spec, load, prompt, a.tokens, layers, eo)};
    if (a.json) std::printf("%s\n", end_to_end_json(r).dump(2).c_str());
    else print_end_to_end_text(r);
    return 0;
  }

  std::fprintf(stderr, "router-probe: loading the weights\n");
  ModelWeights w = load_model_weights(a.model, spec);
  std::vector<LayerWeights> routers(layers.size());  // the chosen layers' router and bias, kept for the comparison
  for (size_t i = 0; i < layers.size(); ++i) {
    routers[i].router = w.layers[size_t(layers[i])].router;
    routers[i].router_bias = w.layers[size_t(layers[i])].router_bias;
  }
  ref::CaptureOptions co;
  co.threads = a.threads;
  co.progress = progress("FP32 run, capturing router inputs");
  ref::RouterCapture cap = ref::capture_router_inputs(spec, std::move(w), prompt, a.tokens, layers, co);

  ProbeReport r;
  r.model = a.model;
  r.prompt_tokens = int(prompt.size());
  r.decode_tokens = a.tokens;
  r.num_experts = spec.num_experts;
  r.top_k = spec.top_k;
  r.weight_tol = a.weight_tol;
  r.tokens = cap.tokens;
  ThreadPool pool(a.threads);
  for (size_t i = 0; i < layers.size(); ++i) {
    std::fprintf(stderr, "router-probe: comparing layer %d's routers on %d rows\n", layers[i], cap.n_rows());
    r.layers.push_back(ref::probe_router_rounding(routers[i], layers[i], spec.top_k, cap.layer_rows(int(i)),
                                                  cap.n_rows(), a.weight_tol, pool));
  }
  if (a.json) std::printf("%s\n", probe_json(r).dump(2).c_str());
  else print_probe_text(r);
  return 0;
}

RunFn setup_router_probe(CLI::App& app) {
  auto a = std::make_shared<RouterProbeArgs>();
  app.footer(
      "How much a BF16 router weight changes expert choices. Default mode: the CPU reference (FP32 router) runs the "
      "prompt and --tokens greedy tokens once; on the rows entering each chosen MoE layer's router (fixed: captured "
      "from that run) the FP32 router is compared with the same router whose weight is rounded to BF16 (logits, "
      "sigmoid and correction bias fp32, the same top-k code). --end-to-end instead decodes --tokens greedy tokens "
      "with each router precision and reports the first step whose token differs. See docs/router-probe.md.\n");
  app.add_option("--model", a->model, "checkpoint directory (config.json + safetensors)")->required();
  auto* layers =
      app.add_option("--layers", a->layers,
                     "MoE layers to probe, comma separated (e.g. 3,20); default: every MoE layer. With --end-to-end: "
                     "the layers whose expert sets are compared (every router is rounded in run B either way)");
  auto* ids = app.add_option(
      "--prompt-ids", a->prompt_ids,
      fmt::format("prompt token ids, comma separated (e.g. 1,15,92); default, when neither this nor --prompt-file is "
                  "given: the {} built-in ids (1 + 37 i) mod vocab_size, i = 0..{}",
                  kDefaultPromptLen, kDefaultPromptLen - 1));
  auto* file = app.add_option("--prompt-file", a->prompt_file,
                              "file of prompt token ids separated by commas, spaces or newlines");
  ids->excludes(file);
  file->excludes(ids);
  app.add_option("--tokens", a->tokens,
                 "greedy tokens after the prompt (FP32 run), fed back and probed too, so each layer gets prompt + N "
                 "rows (>= 0); with --end-to-end, the tokens decoded per run (>= 1)")
      ->capture_default_str();
  auto* tol = app.add_option("--weight-tol", a->weight_tol,
                             "a row's renormalized expert weights (summing to 1) count as changed when one moves by "
                             "more than this")
                  ->capture_default_str();
  app.add_flag("--end-to-end", a->end_to_end,
               "decode --tokens greedy tokens with FP32 routers, then with BF16-rounded routers; report the first "
               "divergence (step, top-2 logits margin there) and the expert sets that changed before it")
      ->excludes(tol);
  app.add_flag("--json", a->json, "print one JSON object on stdout instead of the table (progress stays on stderr)");
  app.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  return [a, layers, ids, file] {
    a->layers_given = layers->count() > 0;
    a->ids_given = ids->count() > 0;
    a->file_given = file->count() > 0;
    return run_router_probe(*a);
  };
}

M3_COMMAND("router-probe", "measure how a BF16 router weight changes expert choices (CPU reference)", setup_router_probe,
           65);

}  // namespace
}  // namespace m3::cli
