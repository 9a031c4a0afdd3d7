// `m3mono generate --model DIR --prompt-ids 1,2,3 --max-tokens N [--temperature T --top-k K
// --top-p P] [--seed N] [--threads N] [--device cpu|cuda|auto] [--weights checkpoint|prepared]
// [--stop-at-eos] [--host-sampling]`: one sequence, prefill then token-by-token decode through the paged cache;
// prints the generated ids and the prefill and decode rates separately.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>

#include "cli/tp_args.h"
#include "cli/backend_choice.h"
#include "cli/command.h"
#include "cli/int_list.h"
#include "cli/speculative_args.h"
#include "core/check.h"
#include "model/load_weights.h"
#include "model/spec.h"
#include "ref/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace m3::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt_ids, device = "auto", weights = "checkpoint", router_dtype = "float32";
  int max_tokens = 16, threads = 0;
  float temperature = 0, top_p = 1;
  int top_k = 0;
  uint64_t seed = 0;
  bool stop_at_eos = false;
  bool device_sampling = true;
  bool mono = false;
  int tp = 1;
  std::string tp_comm = "auto";
  std::string tp_launch = "threads";
  SpeculativeArgs spec;
};

// The backend for --device (cli/backend_choice.h): the CUDA native backend, or the CPU reference on
// the checkpoint's or the dequantized prepared weights (--weights).
std::unique_ptr<Backend> make_backend(const GenerateArgs& a, const ModelSpec& spec, int blocks, int positions) {
  BackendChoice c{a.device, a.weights, a.threads, blocks, positions};
  c.router_dtype = a.router_dtype;
  c.mono = a.mono;
  c.tp = a.tp;
  c.tp_comm = a.tp_comm;
  c.tp_launch = a.tp_launch;
  return make_chosen_backend(c, a.model, spec, "generate");
}

int run_generate(const GenerateArgs& a) {
  SamplingParams sp{a.temperature, a.top_k, a.top_p, a.seed};
  validate_sampling(sp);
  M3_CHECK(a.max_tokens >= 1, "generate: --max-tokens must be >= 1, got {}", a.max_tokens);
  M3_CHECK(a.threads >= 0, "generate: --threads must be >= 0, got {}", a.threads);
  std::vector<int32_t> prompt = parse_token_ids(a.prompt_ids, "generate: --prompt-ids");

  auto t0 = std::chrono::steady_clock::now();
  ModelSpec spec = load_model_spec(a.model);
  const SpeculativeOptions so = speculative_options(a.spec, "generate", a.model, spec,
                                                    a.device == "cuda" || (a.device == "auto" && cuda_usable()));
  BackendChoice check{a.device, a.weights, a.threads};
  check.router_dtype = a.router_dtype;
  check.tp = a.tp;
  check.tp_comm = a.tp_comm;
  check.tp_launch = a.tp_launch;
  validate_backend_choice(check, "generate");
  for (size_t i = 0; i < prompt.size(); ++i)
    M3_CHECK(prompt[i] < spec.vocab_size, "generate: --prompt-ids entry {} ({}) is outside the vocabulary [0, {})", i,
             prompt[i], spec.vocab_size);
  // the last sampled token is never fed back, so the cache holds prompt + max_tokens - 1 positions
  const int64_t positions = int64_t(prompt.size()) + a.max_tokens - 1;
  M3_CHECK(spec.max_positions <= 0 || positions <= spec.max_positions,
           "generate: {} prompt tokens + {} new tokens exceed max_position_embeddings {}", prompt.size(), a.max_tokens,
           spec.max_positions);
  const int bs = spec.index_block;
  const int blocks = int((positions + bs - 1) / bs);
  auto backend = make_backend(a, spec, blocks, int(positions));
  auto t1 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "loaded %s (%s) in %.2f s\n", a.model.c_str(), backend->name().c_str(),
               std::chrono::duration<double>(t1 - t0).count());

  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = a.max_tokens;
  req.sampling = sp;
  req.seed = a.seed;
  req.stop_id = a.stop_at_eos ? spec.eos_id : -1;
  req.device_sampling = a.device_sampling;
  req.speculative = so;
  const GenerateResult res = generate(*backend, req);
  const std::vector<int32_t>& out = res.ids;
  const auto& paths = res.paths;
  const auto& fallbacks = res.fallbacks;

  std::printf("%s\n", fmt::format("{}", fmt::join(out, ",")).c_str());
  double tp = res.prefill_s, td = res.decode_s;
  int nd = int(out.size()) - 1;
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), tp, double(prompt.size()) / tp);
  if (nd > 0) std::fprintf(stderr, "decode: %d tokens in %.3f s (%.1f tokens/s)\n", nd, td, double(nd) / td);
  else std::fprintf(stderr, "decode: no decode steps\n");
  std::string by_path;
  for (const auto& [p, n] : paths) by_path += fmt::format("{}{} {}", by_path.empty() ? "" : ", ", p, n);
  for (const auto& [r, n] : fallbacks) by_path += fmt::format("; fallback {} {}", r, n);
  std::fprintf(stderr, "steps per path: %s\n", by_path.c_str());
  if (so.method != SpeculativeMethod::None)
    std::fprintf(stderr,
                 "speculative %s: %d verify steps, %d drafts, %d kept (acceptance length %.2f tokens a verify step)\n",
                 speculative_method_name(so.method), res.verify_steps, res.drafted, res.accepted,
                 res.verify_steps ? 1.0 + double(res.accepted) / res.verify_steps : 0.0);
  return 0;
}

RunFn setup_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("--model", a->model, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--prompt-ids", a->prompt_ids, "prompt token ids, comma separated (e.g. 1,15,92)")->required();
  app.add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", a->top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--top-p", a->top_p, "nucleus mass (1 = off)")->capture_default_str();
  app.add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  add_tp_options(app, a->tp, a->tp_comm, a->tp_launch);
  app.add_option("--device", a->device, "cpu, cuda or auto (auto: CUDA when available, else cpu)")->capture_default_str();
  app.add_option("--weights", a->weights, "CPU reference weights: checkpoint (fp32) or prepared (the GPU's FP8/MXFP4 store, dequantized)")
      ->capture_default_str();
  app.add_option("--router-dtype", a->router_dtype, "prepared router weight: float32 or bfloat16 (logits, sigmoid and bias stay fp32)")->capture_default_str();
  app.add_flag("--stop-at-eos", a->stop_at_eos, "stop after the model's eos token");
  app.add_flag("--mono", a->mono,
               "CUDA: the fused persistent decode path for the steps it serves (decode and verify steps, <= 4 "
               "rows of <= 4 tokens); prints the steps per path at the end");
  add_speculative_options(app, a->spec);
  app.add_flag("--device-sampling,!--host-sampling", a->device_sampling,
               "sample on the backend (the GPU kernel on CUDA; default) or copy logits back and sample on the host");
  return [a] { return run_generate(*a); };
}

M3_COMMAND("generate", "generate tokens from prompt ids (prints the ids, prefill and decode tokens/s)", setup_generate,
           20);

}  // namespace
}  // namespace m3::cli
