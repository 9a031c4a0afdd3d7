// `m3mono conformance --model DIR [--golden FILE] [--threads N] [--tol X] [--device cpu|cuda|auto]
// [--weights checkpoint|prepared] [--cache-dtype fp32|bf16|fp8]`: runs the CPU reference (or the CUDA backend) against a golden
// file written by transformers (ref/conformance.h) and prints each check with its worst error;
// exits 1 when any check fails.
#include <cstdio>

#include "cli/tp_args.h"
#include "cli/backend_choice.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/load_weights.h"
#include "model/spec.h"
#include "ref/conformance.h"
#include "ref/engine.h"
#include "ref/golden.h"

namespace m3::cli {
namespace {

struct ConformanceArgs {
  std::string model, golden, device = "cpu", weights = "checkpoint", cache_dtype, router_dtype = "float32";
  int threads = 0, tp = 1;
  std::string tp_comm = "auto";
  std::string tp_launch = "threads";
  double tol = 1e-3;
};

int run_conformance_cmd(const ConformanceArgs& a) {
  std::filesystem::path golden = a.golden.empty() ? std::filesystem::path(a.model) / "golden.safetensors"
                                                     : std::filesystem::path(a.golden);
  M3_CHECK(a.tol > 0, "conformance: --tol must be > 0, got {}", a.tol);
  auto prompts = ref::load_golden(golden);
  ModelSpec spec = load_model_spec(a.model);
  int most = 0;
  for (const auto& g : prompts) most = std::max(most, g.tokens() + g.steps());
  BackendChoice c{a.device, a.weights, a.threads, most / spec.index_block + 2, 0, a.cache_dtype};
  c.router_dtype = a.router_dtype;
  c.tp = a.tp;
  c.tp_comm = a.tp_comm;
  c.tp_launch = a.tp_launch;
  auto b = make_chosen_backend(c, a.model, spec, "conformance");
  std::printf("conformance of %s (%s) against %s: %zu prompts\n", a.model.c_str(), b->name().c_str(),
              golden.string().c_str(), prompts.size());
  ref::ConformanceOptions opt;
  opt.logits_rel_tol = a.tol;
  auto rep = ref::run_conformance(*b, prompts, opt, [](const ref::ConformanceCheck& c) {
    std::printf("  [%s] %s: %s\n", c.ok ? " ok " : "FAIL", c.name.c_str(), c.detail.c_str());
    std::fflush(stdout);
  });
  int bad = 0;
  for (const auto& c : rep.checks) bad += !c.ok;
  std::printf("%s: %zu checks, %d failed\n", rep.ok() ? "PASS" : "FAIL", rep.checks.size(), bad);
  return rep.ok() ? 0 : 1;
}

RunFn setup_conformance(CLI::App& app) {
  auto a = std::make_shared<ConformanceArgs>();
  app.add_option("--model", a->model, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--golden", a->golden, "golden file (default: DIR/golden.safetensors)");
  app.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  add_tp_options(app, a->tp, a->tp_comm, a->tp_launch);
  app.add_option("--tol", a->tol, "logits bound: max|d| <= tol * max|ref| per row")->capture_default_str();
  app.add_option("--device", a->device, "cpu, cuda or auto (auto: CUDA when available, else cpu)")->capture_default_str();
  app.add_option("--weights", a->weights, "CPU reference weights: checkpoint (fp32) or prepared (the GPU's store, dequantized)")
      ->capture_default_str();
  app.add_option("--cache-dtype", a->cache_dtype,
                 "K/V and index-K caches: fp8 or bf16 (CUDA: their type, default fp8; CPU reference: round what it "
                 "stores through the GPU's codec), fp32 (CPU reference only, its default: exact)");
  app.add_option("--router-dtype", a->router_dtype, "prepared router weight: float32 or bfloat16 (logits, sigmoid and bias stay fp32)")->capture_default_str();
  return [a] { return run_conformance_cmd(*a); };
}

M3_COMMAND("conformance", "check the CPU reference (or --device cuda) against a transformers golden file", setup_conformance, 60);

}  // namespace
}  // namespace m3::cli
