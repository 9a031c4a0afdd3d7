// The CUDA harness of `m3mono bench` (cuda_bench.h): probes (copy bandwidth = the floor's
// bandwidth, streaming-read ceiling, kernel-boundary cost, bf16 tensor-core rate for prefill),
// random prepared weights and caches on the device, every case on every path inside CUDA graphs
// with an L2 flush outside the timed region before each replay, per-op spans, and the per-kernel
// benches.
#include "bench/cuda_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "bench/cuda/device_weights.h"
#include "bench/cuda/eagle3_bench.h"
#include "native/bucket_rows.h"
#include "bench/cuda/graph_timer.h"
#include "bench/cuda/kernel_bench.h"
#include "bench/cuda/lt_matmul.h"
#include "bench/cuda/probes.h"
#include "bench/cuda/step_runner.h"
#include "native/cuda_check.h"

namespace m3::bench {

bool cuda_bench_available() { return true; }

namespace {

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t n) { M3_CUDA_CHECK(cudaMalloc(&p, n)); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

double event_median_us(int reps, const Enqueue& fn, cudaStream_t s) {
  cudaEvent_t a, b;
  M3_CUDA_CHECK(cudaEventCreate(&a));
  M3_CUDA_CHECK(cudaEventCreate(&b));
  fn(s);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    M3_CUDA_CHECK(cudaEventRecord(a, s));
    fn(s);
    M3_CUDA_CHECK(cudaEventRecord(b, s));
    M3_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return summarize(t).median;
}

// Copy bandwidth (2 GiB device-to-device, read + write bytes counted) and the streaming-read
// ceiling (1 GiB in one launch), on random data.
void probe_bandwidth(BenchReport& r, cudaStream_t s) {
  const size_t n = size_t(2) << 30;
  DevBuf a(n), b(n);
  fill_random(a.p, 1, int64_t(n), int64_t(n), FillFormat::Bytes, 0, 0, 3, s);
  const double copy_us = event_median_us(
      7, [&](cudaStream_t st) { M3_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, st)); }, s);
  r.copy_GBps = 2.0 * double(n) / copy_us / 1e3;
  r.copy_method = "cudaMemcpyAsync device-to-device 2 GiB, read + write counted, median of 7";
  SegmentReader rd;
  const int one = rd.add({ReadSeg{a.p, size_t(1) << 30}});
  const double read_us = event_median_us(7, [&](cudaStream_t st) { rd.read(one, st); }, s);
  r.read_GBps = double(size_t(1) << 30) / read_us / 1e3;
}

// Cost of one kernel boundary inside a graph: 600 empty kernels, per kernel.
double probe_boundary(cudaStream_t s) {
  GraphTiming t = time_graph(
      [](cudaStream_t st) {
        for (int i = 0; i < 600; ++i) launch_empty(st);
      },
      s, 3, 20);
  return t.us.median / 600;
}

std::string device_name() {
  int dev = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  M3_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return fmt::format("{} ({} SMs, L2 {} MB, {:.0f} GiB)", p.name, p.multiProcessorCount, p.l2CacheSize >> 20,
                     double(p.totalGlobalMem) / double(1 << 30));
}

using OpGroups = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Per-op rows of a path: the accounting's ops (bytes, floor), the rows of each of the path's op
// groups merged into one row named for the group (at the first member's place), with the path's
// spans summed by op name, then any op the path marks that the accounting does not have.
std::vector<OpTiming> op_rows(const StepBytes& b, const std::vector<OpSpan>& spans, double GBps,
                              const OpGroups& groups = {}) {
  std::vector<OpTiming> rows;
  for (const auto& t : b.ops) rows.push_back(OpTiming{t.op, t.count, t.bytes, t.bytes / (GBps * 1e3), NAN, NAN, -1});
  for (const auto& [name, members] : groups) {
    auto first = rows.end();
    for (auto it = rows.begin(); it != rows.end();) {
      if (std::find(members.begin(), members.end(), it->op) == members.end()) {
        ++it;
        continue;
      }
      if (first == rows.end()) {
        it->op = name;
        first = it++;
        continue;
      }
      first->bytes += it->bytes;
      first->floor_us += it->floor_us;
      const ptrdiff_t at = first - rows.begin();
      it = rows.erase(it);
      first = rows.begin() + at;
    }
  }
  for (const auto& sp : spans) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const OpTiming& o) { return o.op == sp.op; });
    if (it == rows.end()) it = rows.insert(rows.end(), OpTiming{sp.op, 0, 0, 0, NAN, NAN, -1});
    it->us = (std::isfinite(it->us) ? it->us : 0) + sp.us;
    if (sp.launches >= 0) it->kernels = (it->kernels < 0 ? 0 : it->kernels) + sp.launches;
    if (it->bytes == 0) it->count += 1;
  }
  return rows;
}

void run_steps(const BenchOptions& o, const ModelSpec& spec, BenchReport& r, cudaStream_t s) {
  std::vector<std::string> paths = o.paths;
  if (paths.empty()) paths = {"stream", "native"};  // flat and mono are asked for by name (mono is opt-in)
  if (std::find(paths.begin(), paths.end(), "stream") == paths.end()) paths.push_back("stream");  // the reference
  std::vector<StepRunnerFactory> factories;
  for (const auto& p : paths) factories.push_back(step_path(p));  // unknown names fail before any allocation

  const auto cases = make_cases(o.batches, o.contexts, o.prefills, o.queries);
  PrepareOptions po;
  po.router_bf16 = o.router_bf16;
  po.fp8_tiled = !o.fp8_rows;
  po.mxfp8_projections = po.mxfp8_experts = o.weights == "mxfp8";
  const PreparedLayout layout = plan_prepared(spec, po);
  StepBytesOptions bo;
  bo.kv_dtype = o.kv_bf16 ? DType::BF16 : DType::F8_E4M3;
  bo.ik_dtype = o.ik_bf16 ? DType::BF16 : DType::F8_E4M3;
  int64_t blocks = 1;
  for (const auto& c : cases) {
    M3_CHECK(spec.max_positions <= 0 || c.max_len() <= spec.max_positions, "bench: {} needs {} positions, the model has {}",
             c.label(), c.max_len(), spec.max_positions);
    blocks = std::max<int64_t>(blocks, int64_t(c.is_prefill() ? 1 : c.batch) * blocks_per_row(c, spec.index_block));
  }
  const native::KvCacheShape cshape = native::kv_cache_shape(spec, int(blocks), bo.kv_dtype, bo.ik_dtype);
  int dev = 0, l2 = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  M3_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t flush_bytes = size_t(4) * size_t(l2);
  size_t free_b = 0, total_b = 0;
  M3_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double need = double(layout.total_bytes) + double(cshape.total_bytes()) + double(flush_bytes) + 2e9;
  M3_CHECK(need <= double(free_b),
           "bench: weights {:.1f} GB + caches {:.1f} GB ({} blocks) + scratch do not fit in {:.1f} GB free; use "
           "--tp-shard, --layers or smaller --batch / --context",
           double(layout.total_bytes) / 1e9, double(cshape.total_bytes()) / 1e9, blocks, double(free_b) / 1e9);

  DeviceArena arena(layout, o.seed, s);  // the only weight allocation: every path reads it
  native::DeviceKvCache cache(cshape);
  fill_cache_random(cache, o.seed, s);
  DevBuf flush(flush_bytes);
  fill_random(flush.p, 1, int64_t(flush_bytes), int64_t(flush_bytes), FillFormat::Bytes, 0, 0, 99, s);
  SegmentReader flusher;
  const int flush_list = flusher.add({ReadSeg{flush.p, flush_bytes}});
  const Enqueue between = [&](cudaStream_t st) { flusher.read(flush_list, st); };
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  r.notes.push_back(fmt::format("weights {:.2f} GB random on the device, caches {:.2f} GB ({} blocks of {}); a {} MB "
                                "read flushes the L2 before every timed replay (outside the timing)",
                                double(layout.total_bytes) / 1e9, double(cshape.total_bytes()) / 1e9, blocks,
                                spec.index_block, flush_bytes >> 20));

  StepEnv env;
  env.spec = &spec;
  env.layout = &layout;
  env.arena = arena.base();
  env.weights = arena.prepared();
  env.cache = &cache;
  env.bytes_opt = bo;
  env.seed = o.seed;
  env.trace = o.trace;
  env.aux_layers = o.aux_layers;
  for (int l : o.aux_layers)
    M3_CHECK(l >= 0 && l <= spec.num_layers, "bench: --aux-layers {} outside [0, {}] (the measured layers)", l,
             spec.num_layers);
  for (const auto& c : cases) {
    env.max_len = std::max(env.max_len, c.max_len());
    if (c.is_prefill()) env.max_prefill = std::max(env.max_prefill, c.prefill);
    else env.max_batch = std::max(env.max_batch, native::decode_bucket(c.batch) * c.query);  // token rows
  }
  std::vector<std::unique_ptr<StepRunner>> runners;
  for (auto& f : factories) runners.push_back(f(env));

  const int op_reps = std::clamp(o.steps / 5, 5, 30);
  for (const auto& c : cases) {
    CaseResult cr;
    cr.c = c;
    cr.bytes = step_bytes(layout, c, bo);
    std::vector<std::vector<OpSpan>> spans;
    for (auto& run : runners) {
      run->setup(c, s);
      GraphTiming t;
      std::vector<OpSpan> sp;
      const bool graph = run->capturable();
      if (graph) {
        t = time_graph([&](cudaStream_t st) { run->enqueue(st, nullptr); }, s, o.warmup, o.steps, between);
        sp = time_ops([&](cudaStream_t st, OpRecorder* rec) { run->enqueue(st, rec); }, s, op_reps, between);
      } else {  // eager: setup ran it once (the warm-up); a few timed runs, spans from the same runs
        EagerTiming et = time_eager([&](cudaStream_t st, OpRecorder* rec) { run->run_eager(st, rec); }, s,
                                    o.eager_reps, between);
        t.us = et.us;
        t.kernels = -1;
        sp = std::move(et.spans);
      }
      const std::string bad = run->check_outputs();
      if (!bad.empty()) {
        std::fprintf(stderr, "bench: %s path, %s: %s\n", run->name().c_str(), c.label().c_str(), bad.c_str());
        r.notes.push_back(fmt::format("{} {}: OUTPUTS NOT SANE: {}", run->name(), c.label(), bad));
      }
      // Each timing event node adds a fixed cost to the instrumented graph (about 2 us per mark
      // on an H200): take the excess over the clean step evenly off every span.
      double sum = 0;
      for (const auto& x : sp) sum += x.us;
      const double delta = sp.empty() ? 0 : std::max(0.0, (sum - t.us.median) / double(sp.size()));
      for (auto& x : sp) x.us = std::max(0.0, x.us - delta);
      spans.push_back(std::move(sp));
      auto hit = run->experts_hit();
      if (!hit.empty() && cr.bytes.expert_model != "given") {  // the first path with real routing sets the bytes
        StepBytesOptions g = bo;
        g.experts_hit = hit;
        cr.bytes = step_bytes(layout, c, g);
        cr.bytes.expert_model = "given (" + run->name() + " routing)";
      }
      PathResult p;
      p.path = run->name();
      p.us = t.us;
      p.kernels = t.kernels;
      p.gap_us = graph ? t.kernels * r.boundary_us : NAN;
      p.path_bytes = run->path_bytes();
      p.note = run->note();
      if (graph)
        p.note += fmt::format("{}per-op spans: event-instrumented step {:.1f} us, {:.2f} us per mark taken off each span",
                              p.note.empty() ? "" : "; ", sum, delta);
      else
        p.note += fmt::format("{}eager: median of {} runs after a warm-up run, an event before each op in each "
                              "run (spans sum to {:.1f} us, {:.2f} us taken off each)",
                              p.note.empty() ? "" : "; ", o.eager_reps, sum, delta);
      cr.paths.push_back(std::move(p));
    }
    cr.floor_us = cr.bytes.total / (r.copy_GBps * 1e3);
    cr.flop_floor_us = r.tc_peak_tflops > 0 ? cr.bytes.flops / (r.tc_peak_tflops * 1e6) : NAN;
    // per-op rows, with the stream path's time of the same op as its plain read
    std::map<std::string, double> read;
    for (size_t i = 0; i < runners.size(); ++i) {
      cr.paths[i].ops = op_rows(cr.bytes, spans[i], r.copy_GBps, runners[i]->op_groups());
      if (runners[i]->name() == "stream")
        for (const auto& op : cr.paths[i].ops) read[op.op] = op.us;
    }
    for (size_t i = 0; i < runners.size(); ++i) {
      std::map<std::string, double> rd = read;  // a group's plain read: the sum of its members'
      for (const auto& [name, members] : runners[i]->op_groups()) {
        double sum = 0;
        bool all = true;
        for (const auto& m : members)
          if (read.count(m)) sum += read[m];
          else all = all && std::none_of(cr.bytes.ops.begin(), cr.bytes.ops.end(), [&](const OpTotal& t) { return t.op == m; });
        if (all && !read.empty()) rd[name] = sum;
      }
      for (auto& op : cr.paths[i].ops)
        if (rd.count(op.op)) op.read_us = rd[op.op];
    }
    r.cases.push_back(std::move(cr));
    std::fprintf(stderr, "  %s done\n", r.cases.back().c.label().c_str());
  }
}

}  // namespace

BenchReport run_cuda_bench(const BenchOptions& o) {
  M3_CHECK(o.steps >= 1 && o.warmup >= 0 && o.eager_reps >= 1, "bench: --steps {} / --warmup {} / --eager-reps {}", o.steps,
           o.warmup, o.eager_reps);
  register_builtin_paths();
  std::string name;
  const ModelSpec spec = bench_spec(o, &name);
  CudaStream cs;
  cudaStream_t s = cs.s;

  BenchReport r;
  r.mode = "cuda";
  r.date = utc_now();
  r.device = device_name();
  r.model = name;
  r.layers = spec.num_layers;
  r.tp_shard = o.tp_shard;
  r.kv_dtype = o.kv_bf16 ? "bf16" : "fp8";
  r.ik_dtype = o.ik_bf16 ? "bf16" : "fp8";
  r.warmup = o.warmup;
  r.steps = o.steps;
  if (o.steps < 100) r.notes.push_back(fmt::format("only {} steps per case (>= 100 for reported figures)", o.steps));

  probe_bandwidth(r, s);
  r.boundary_us = probe_boundary(s);
  if (std::isfinite(o.tc_peak_tflops)) {
    r.tc_peak_tflops = o.tc_peak_tflops;
    r.tc_peak_source = "--tc-peak";
  } else if (!o.prefills.empty() && !o.no_steps) {
    r.tc_peak_tflops = bf16_matmul_tflops(8192, 10, s);
    r.tc_peak_source = "cuBLASLt bf16 8192^3 on random data, median of 10 (this run)";
  } else {
    r.tc_peak_source = "not measured (no prefill case)";
  }
  std::fprintf(stderr, "bench: copy %.0f GB/s, read %.0f GB/s, boundary %.2f us\n", r.copy_GBps, r.read_GBps,
               r.boundary_us);

  if (!o.no_steps) run_steps(o, spec, r, s);
  if (o.eagle3_draft) bench_eagle3_draft(spec, o.seed, r);
  if (o.kernels) {
    KernelBenchOptions ko;
    ko.seed = o.seed;
    ko.Ms = o.kernel_ms;
    ko.tps = o.kernel_tps;
    ko.cublas = o.kernel_cublas;
    auto g = bench_fp8_gemv(ko, s);
    r.kernels.insert(r.kernels.end(), g.begin(), g.end());
    auto m = bench_moe(ko, s);
    r.kernels.insert(r.kernels.end(), m.begin(), m.end());
  }
  return r;
}

}  // namespace m3::bench
