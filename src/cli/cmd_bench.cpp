// `m3mono bench`: step latency against its memory floor (bench/). On the GPU: random prepared
// weights at the real MiniMax-M3 shapes (one rank of --tp-shard K), decode batches at --context
// and prefills of --prefill tokens, each step timed inside a CUDA graph (median, p90 over
// --steps replays after --warmup), its floor = the bytes it must read / the copy bandwidth
// measured in the same run, per-op breakdown, paths side by side (--paths), per-kernel benches
// (--kernels). With --device cpu: the CPU smoke mode (tiny shapes, reference engine) that CI runs.
// Output: a table on stdout, --json FILE, --chart FILE (PNG through tools/bench_chart.py).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "bench/cpu_bench.h"
#include "bench/cuda_bench.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/synthetic.h"

namespace m3::cli {
namespace {

struct BenchArgs {
  bench::BenchOptions o;
  std::string batch = "1", query = "1", context, prefill, paths, json, chart;
};

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

int run_bench(BenchArgs& a) {
  bench::BenchOptions& o = a.o;
  M3_CHECK(o.device == "cpu" || o.device == "cuda", "bench: --device must be cpu or cuda, got '{}'", o.device);
  o.batches = bench::parse_count_list(a.batch, "--batch");
  // NOTE: the CPU smoke mode's tiny models hold 4096 positions, so its default context is smaller.
  if (a.context.empty()) a.context = o.device == "cpu" ? "1K" : "8K";
  o.contexts = bench::parse_count_list(a.context, "--context");
  o.queries = bench::parse_count_list(a.query, "--query");
  o.prefills = a.prefill.empty() ? std::vector<int64_t>{} : bench::parse_count_list(a.prefill, "--prefill");
  o.paths = split_names(a.paths);
  M3_CHECK(!o.kernel_ms.empty() && !o.kernel_tps.empty(), "bench: --kernel-ms and --kernel-tps need at least one value");
  for (int m : o.kernel_ms) M3_CHECK(m >= 1 && m <= 4096, "bench: --kernel-ms: {} is not a token count in 1..4096", m);
  for (int t : o.kernel_tps)
    M3_CHECK(t == 1 || t == 2 || t == 4 || t == 8, "bench: --kernel-tps: {} is not a shard count of 1, 2, 4 or 8", t);
  if (o.commit.empty()) {
    const char* c = std::getenv("M3_COMMIT");
    o.commit = c && *c ? c : "unknown";
  }
  bench::BenchReport r = o.device == "cpu" ? bench::run_cpu_bench(o) : bench::run_cuda_bench(o);
  r.commit = o.commit;
  r.command = bench::this_command_line();
  bench::print_report(r, stdout);
  std::fflush(stdout);
  std::string json = a.json;
  if (json.empty() && !a.chart.empty()) json = a.chart + ".json";
  if (!json.empty()) {
    bench::write_report_json(r, json);
    std::fprintf(stderr, "wrote %s\n", json.c_str());
  }
  if (!a.chart.empty()) {
    int rc = bench::run_chart_script(json, a.chart);
    M3_CHECK(rc == 0, "bench: --chart: tools/bench_chart.py exited with {}", rc);
    std::fprintf(stderr, "wrote %s\n", a.chart.c_str());
  }
  return 0;
}

RunFn setup_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  bench::BenchOptions& o = a->o;
  o.device = bench::cuda_bench_available() ? "cuda" : "cpu";
  app.add_option("--device", o.device, "cuda (random weights on the GPU) or cpu (smoke mode, reference engine)")
      ->capture_default_str();
  std::string names;
  for (const auto& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--preset", o.preset, "model shape: " + names + " (default: real on cuda, tiny on cpu)");
  app.add_option("--config", o.config, "model shape from a config.json or checkpoint directory instead");
  app.add_option("--layers", o.layers, "the last N layers of the plan (0 = all)")->capture_default_str();
  app.add_option("--tp-shard", o.tp_shard, "one tensor-parallel rank's shapes of K ranks")->capture_default_str();
  app.add_option("--batch", a->batch, "decode rows per step, comma list (e.g. 1,2,4,8,16)")->capture_default_str();
  app.add_option("--query", a->query,
                 "decode cases: tokens per row, comma list of 1..4 (1 a decode step; 2..4 a speculative verify step "
                 "of the last token and its drafts, e.g. 1,4)")
      ->capture_default_str();
  app.add_option("--context", a->context, "tokens cached per row, comma list (e.g. 1K,8K,64K; default 8K on cuda, 1K on cpu)");
  app.add_option("--prefill", a->prefill, "prefill cases: tokens of one request, comma list (e.g. 8K)");
  app.add_option("--paths", a->paths, "step paths side by side, comma list (cuda: stream, the plain read of the step's bytes one launch per op, always run; flat, the same bytes in two launches (the sparse layers' in one: mono's yardstick); native, the plans CudaBackend runs (native/forward.h); mono, the same with the sparse layers in one persistent launch (src/mono); mono:key=value/..., mono with options (poll_ns, pin, reserve, small, stage, smem_min, smem_cap, ring, early, stream, fp8_whole, fence, grid, serialized, watchdog_ms: src/mono/options.h; e.g. mono:stream=1/smem_cap=110592); cpu: cpu-ref; default: stream,native)");
  app.add_option("--steps", o.steps, "timed steps per case (after warm-up)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--eager-reps", o.eager_reps, "timed runs of steps a path cannot capture (the native prefill)")
      ->capture_default_str();
  app.add_flag("--kv-bf16", o.kv_bf16, "K/V cache in BF16 instead of FP8");
  app.add_flag("--index-bf16", o.ik_bf16, "index-K cache in BF16 instead of FP8");
  app.add_flag("--router-bf16", o.router_bf16, "router weight in BF16 instead of FP32");
  app.add_flag("--fp8-rows", o.fp8_rows,
               "FP8 projection codes row-major instead of the arena's 16-row tiles (docs/formats.md; the same "
               "bits, for a side-by-side timing)");
  app.add_option("--weights", o.weights,
                 "formats of the random weights: fp8 (attention projections E4M3 + a row scale, experts MXFP4: what the "
                 "BF16 and MXFP4 releases load as) or mxfp8 (projections and experts E4M3 + E8M0 per 32: what the MXFP8 "
                 "release loads as; mono refuses it)")
      ->check(CLI::IsMember({"fp8", "mxfp8"}))
      ->capture_default_str();
  app.add_flag("--kernels", o.kernels, "cuda: per-kernel benches (FP8 GEMV, MXFP4 experts) vs plain reads and cuBLASLt");
  app.add_option("--kernel-ms", o.kernel_ms, "--kernels: token counts, comma list")->delimiter(',')->capture_default_str();
  app.add_option("--kernel-tps", o.kernel_tps, "--kernels: tensor-parallel shards, comma list")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("!--no-cublas", o.kernel_cublas, "--kernels: leave cuBLASLt out");
  app.add_flag("--no-steps", o.no_steps, "skip the whole-step cases");
  app.add_option("--threads", o.threads, "cpu: reference threads (0 = all cores)")->capture_default_str();
  app.add_option("--seed", o.seed, "random weights / routing seed")->capture_default_str();
  app.add_option("--commit", o.commit, "commit recorded in the report (default $M3_COMMIT)");
  app.add_option("--tc-peak", o.tc_peak_tflops, "tensor-core peak TFLOP/s for the prefill fraction (default: measured)");
  app.add_option("--trace", o.trace,
                 "mono: per-task device timestamps of each decode case's set-up step to TRACE.<path>.b<batch>.ctx<context>.csv "
                 "(op, item, layer, code, wait/run/end ns) and a per-op summary in the report");
  app.add_option("--aux-layers", o.aux_layers,
                 "cuda decode cases: copy out the hidden states entering these layers every step (EAGLE3 drafts read "
                 "2,30,57 of MiniMax-M3; mono then runs its layers in parts), comma list")
      ->delimiter(',');
  app.add_flag("--eagle3-draft", o.eagle3_draft,
               "cuda: also time the EAGLE3 draft network on the GPU (random weights of a draft for this model's hidden "
               "size and vocabulary: one observed row and a draft row, wall time)");
  app.add_option("--json", a->json, "write the results as JSON");
  app.add_option("--chart", a->chart, "write a PNG of latency vs batch and context with the floor (needs matplotlib)");
  return [a] { return run_bench(*a); };
}

M3_COMMAND("bench", "step latency vs its memory floor (cuda: real shapes, random weights; cpu: smoke mode)",
           setup_bench, 60);

}  // namespace
}  // namespace m3::cli
