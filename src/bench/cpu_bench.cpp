// CPU smoke mode (cpu_bench.h): the reference backend on synthetic weights, per-step host timing.
#include "bench/cpu_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "bench/step_bytes.h"
#include "core/check.h"
#include "model/prepare.h"
#include "model/synthetic.h"
#include "ref/engine.h"

namespace m3::bench {

double host_copy_GBps(size_t bytes, int reps) {
  M3_CHECK(bytes >= 4096 && reps >= 1, "bench: host copy of {} bytes x {}", bytes, reps);
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);  // first touch out of the timing
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    a[size_t(i) % bytes] = uint8_t(i);
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  volatile uint8_t keep = b[bytes / 2];
  (void)keep;
  return 2.0 * double(bytes) / summarize(s).median / 1e9;
}

namespace {

// Decode rows r = 0..B-1, each its own request over blocks [r * W, (r + 1) * W).
std::vector<int32_t> row_table(int r, int width) {
  std::vector<int32_t> t(static_cast<size_t>(width));
  for (int i = 0; i < width; ++i) t[size_t(i)] = r * width + i;
  return t;
}

}  // namespace

BenchReport run_cpu_bench(const BenchOptions& o) {
  M3_CHECK(o.steps >= 1 && o.warmup >= 0, "bench: --steps {} / --warmup {}", o.steps, o.warmup);
  M3_CHECK(!o.kernels, "bench: --kernels needs --device cuda");
  M3_CHECK(!o.eagle3_draft, "bench: --eagle3-draft needs --device cuda");
  for (const auto& p : o.paths)
    M3_CHECK(p == "cpu-ref", "bench: path '{}' is not available with --device cpu (only cpu-ref)", p);
  std::string name;
  const ModelSpec spec = bench_spec(o, &name);
  const auto cases = make_cases(o.batches, o.contexts, o.prefills, o.queries);
  const int bs = spec.index_block;
  int64_t blocks = 0;
  for (const auto& c : cases) {
    M3_CHECK(spec.max_positions <= 0 || c.max_len() <= spec.max_positions,
             "bench: {} needs {} positions, the model has {}", c.label(), c.max_len(), spec.max_positions);
    const int64_t rows = c.is_prefill() ? 1 : c.batch;
    blocks = std::max(blocks, rows * ((c.max_len() + bs - 1) / bs));
  }
  M3_CHECK(blocks <= (int64_t(1) << 20), "bench: cpu mode would need {} cache blocks; use smaller cases", blocks);

  PrepareOptions po;
  po.router_bf16 = o.router_bf16;
  po.fp8_tiled = !o.fp8_rows;
  po.mxfp8_projections = po.mxfp8_experts = o.weights == "mxfp8";
  const PreparedLayout layout = plan_prepared(spec, po);
  // The reference holds fp32 weights: about 8x the prepared bytes. A smoke mode, not a simulator.
  M3_CHECK(layout.total_bytes <= (uint64_t(256) << 20),
           "bench: --device cpu is a smoke mode for small shapes; model {} is {:.1f} GB prepared (use --device cuda, "
           "or a small --preset such as tiny)", name, double(layout.total_bytes) / 1e9);
  StepBytesOptions so;
  so.kv_dtype = o.kv_bf16 ? DType::BF16 : DType::F8_E4M3;
  so.ik_dtype = o.ik_bf16 ? DType::BF16 : DType::F8_E4M3;

  BenchReport r;
  r.mode = "cpu";
  r.date = utc_now();
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  r.device = fmt::format("cpu reference, {} threads", threads);
  r.model = name;
  r.layers = spec.num_layers;
  r.tp_shard = o.tp_shard;
  r.kv_dtype = o.kv_bf16 ? "bf16" : "fp8";
  r.ik_dtype = o.ik_bf16 ? "bf16" : "fp8";
  r.warmup = o.warmup;
  r.steps = o.steps;
  r.copy_GBps = host_copy_GBps(size_t(64) << 20, 5);
  r.copy_method = "host memcpy 64 MiB, median of 5";
  r.read_GBps = NAN;
  r.boundary_us = NAN;
  r.tc_peak_tflops = std::isfinite(o.tc_peak_tflops) ? o.tc_peak_tflops : 0;
  r.tc_peak_source = std::isfinite(o.tc_peak_tflops) ? "--tc-peak" : "none (cpu)";
  r.notes.push_back(
      "cpu smoke mode: the fp32 reference engine on random synthetic weights; bytes and floor are those of the "
      "prepared formats over a host copy, so the fractions are not a performance figure");
  if (o.steps < 100) r.notes.push_back(fmt::format("only {} steps per case (>= 100 for reported figures)", o.steps));

  if (o.no_steps) return r;
  SyntheticOptions syn;
  syn.seed = o.seed;
  auto backend = ref::make_ref_backend(spec, synthetic_weights(spec, syn), ref::RefOptions{int(blocks), o.threads});
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(0, spec.vocab_size - 1);

  for (const auto& c : cases) {
    CaseResult cr;
    cr.c = c;
    cr.bytes = step_bytes(layout, c, so);
    cr.floor_us = cr.bytes.total / (r.copy_GBps * 1e3);
    cr.flop_floor_us = r.tc_peak_tflops > 0 ? cr.bytes.flops / (r.tc_peak_tflops * 1e6) : NAN;
    StepBatch step;
    if (c.is_prefill()) {
      SeqStep s;
      s.start_pos = 0;
      for (int64_t i = 0; i < c.prefill; ++i) s.tokens.push_back(tok(rng));
      s.block_table = row_table(0, int((c.prefill + bs - 1) / bs));
      step.seqs.push_back(std::move(s));
    } else {
      const int width = int((c.max_len() + bs - 1) / bs);
      StepBatch fill;
      for (int b = 0; b < c.batch; ++b) {
        SeqStep s;
        s.start_pos = int32_t(c.context);
        for (int k = 0; k < c.query; ++k) s.tokens.push_back(tok(rng));
        s.block_table = row_table(b, width);
        if (c.context > 0) {
          SeqStep f;
          for (int64_t i = 0; i < c.context; ++i) f.tokens.push_back(tok(rng));
          f.block_table = s.block_table;
          fill.seqs.push_back(std::move(f));
        }
        step.seqs.push_back(std::move(s));
      }
      if (!fill.seqs.empty()) backend->step(fill);  // the rows' history, written once
    }
    // Each timed step writes the same new slots again (the cache does not grow between steps).
    for (int i = 0; i < o.warmup; ++i) backend->step(step);
    std::vector<double> us;
    for (int i = 0; i < o.steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      StepOutput out = backend->step(step);
      auto t1 = std::chrono::steady_clock::now();
      M3_CHECK(!out.logits.empty() && std::isfinite(out.logits[0]), "bench: {} produced no finite logits",
               c.label());
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    PathResult p;
    p.path = "cpu-ref";
    p.us = summarize(us);
    p.gap_us = NAN;
    for (const auto& t : cr.bytes.ops)
      p.ops.push_back(OpTiming{t.op, t.count, t.bytes, t.bytes / (r.copy_GBps * 1e3), NAN, NAN, -1});
    cr.paths.push_back(std::move(p));
    r.cases.push_back(std::move(cr));
  }
  return r;
}

}  // namespace m3::bench
