// The options of `m3mono bench` (cli/cmd_bench.cpp parses them) and the model spec they select.
// Both the CPU smoke mode (bench/cpu_bench.h) and the CUDA harness (bench/cuda_bench.h) read them.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace m3::bench {

struct BenchOptions {
  std::string device = "cuda";          // "cuda" | "cpu"
  std::string preset;                   // synthetic preset name ("" = "real" on cuda, "tiny" on cpu)
  std::string config;                   // or a config.json / checkpoint directory (shape only)
  int layers = 0;                       // 0 = every layer; else the last N layers of the plan
  int tp_shard = 1;                     // one rank's shapes of K ranks
  std::vector<int64_t> batches{1};
  std::vector<int64_t> contexts{8192};
  std::vector<int64_t> prefills;
  std::vector<int64_t> queries{1};      // decode cases' tokens per row (2 .. 4: verify steps)
  std::vector<std::string> paths;       // empty = the device's default paths
  int steps = 100, warmup = 10;
  int eager_reps = 3;                   // timed runs of a step a path cannot capture (native prefill)
  bool kv_bf16 = false, ik_bf16 = false, router_bf16 = false;
  bool fp8_rows = false;                // FP8 projection codes row-major instead of tiled (a side-by-side run)
  std::string weights = "fp8";          // fp8 (row-scaled projections, MXFP4 experts) or mxfp8 (the MXFP8 release's)
  bool kernels = false;                 // cuda: per-kernel benches (FP8 GEMV, MXFP4 experts, cuBLASLt)
  std::vector<int> kernel_ms{1, 2, 4, 8, 16};  // --kernels: token counts
  std::vector<int> kernel_tps{1, 4};            // --kernels: tensor-parallel shards
  bool kernel_cublas = true;                    // --kernels: cuBLASLt beside the FP8 kernel
  bool no_steps = false;                // skip the whole-step cases (only probes / kernels)
  int threads = 0;                      // cpu: reference threads (0 = all cores)
  uint64_t seed = 1;
  std::string commit;                   // recorded in the report ("" = $M3_COMMIT or "unknown")
  double tc_peak_tflops = NAN;          // prefill fraction denominator (NaN = measured bf16 GEMM on cuda)
  std::string trace;                    // mono: per-task device timestamps of each case's set-up step, to
                                        // <trace>.b<batch>.ctx<context>.csv (and a summary in the report)
  bool eagle3_draft = false;            // cuda: time the EAGLE3 draft network (bench/cuda/eagle3_bench.h)
  std::vector<int> aux_layers;          // cuda decode: copy the hidden states entering these layers out
                                        // (EAGLE3's, native/aux_capture.h; mono runs in parts)
};

// The spec a run measures: preset or config, cut to --layers, then one rank of --tp-shard.
ModelSpec bench_spec(const BenchOptions& o, std::string* name = nullptr);

}  // namespace m3::bench
