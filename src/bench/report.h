// The results of one `m3mono bench` run and their two renderings: a table on stdout and JSON
// (schema "m3mono-bench/1", described in docs/perf.md). Times are microseconds per step; NaN
// means "not measured" (JSON null).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_case.h"
#include "bench/stats.h"
#include "bench/step_bytes.h"

namespace m3::bench {

struct OpTiming {
  std::string op;
  int count = 0;            // ops of this name in the step (layers)
  double bytes = 0;         // by the step accounting
  double floor_us = 0;      // bytes / copy bandwidth
  double us = 0;            // measured inside the step (NaN: not measured)
  double read_us = 0;       // plain cold streaming read of the same bytes, same launches (NaN: not measured)
  int kernels = -1;         // kernels of this op in the step (-1: unknown)
};

struct PathResult {
  std::string path;         // "cpu-ref", "stream", "native", "mono"
  Stats us;                 // per-step times
  double path_bytes = 0;    // bytes this path read, when it differs from the accounting (stream); 0 = n/a
  int kernels = -1;         // kernel nodes in the captured step (-1: not a graph)
  double gap_us = 0;        // estimated kernel-boundary time: kernels x the measured boundary cost; NaN: n/a
  std::vector<OpTiming> ops;
  std::string note;
};

struct CaseResult {
  BenchCase c;
  StepBytes bytes;
  double floor_us = 0;      // bytes.total / copy bandwidth
  double flop_floor_us = 0; // bytes.flops / tensor-core peak (prefill)
  std::vector<PathResult> paths;
};

// One kernel measured against its plain read (and cuBLASLt where it applies).
struct KernelResult {
  std::string kernel;       // "fp8_gemv", "moe_mxfp4", ...
  std::string shape;        // "2560x6144 (tp4 qkv)"
  int M = 0;                // tokens
  double bytes = 0;         // bytes the kernel must read
  double us = 0;            // median per launch
  double read_us = 0;       // plain cold read of `bytes`, same launch count
  double cublas_us = 0;     // cuBLASLt on the same shape (NaN: not run)
  std::string cublas_note;  // e.g. "fp8 e4m3, outer-vector fp32 scales"
  double flops = 0;
};

struct BenchReport {
  std::string schema = "m3mono-bench/1";
  std::string date, device, commit, command, model, mode;  // mode: "cpu" | "cuda"
  int layers = 0, tp_shard = 1;
  std::string kv_dtype, ik_dtype;
  int warmup = 0, steps = 0;
  double copy_GBps = 0;        // the floor's bandwidth: large copy, read + write bytes counted
  std::string copy_method;     // "cudaMemcpy d2d 2 GiB" / "memcpy 64 MiB (host)"
  double read_GBps = 0;        // streaming read, one large launch (NaN: not measured)
  double boundary_us = 0;      // cost of one kernel boundary inside a graph (NaN: not measured)
  double tc_peak_tflops = 0;   // tensor-core peak the prefill fraction is taken against
  std::string tc_peak_source;
  std::vector<CaseResult> cases;
  std::vector<KernelResult> kernels;
  std::vector<std::string> notes;
};

// UTC "YYYY-MM-DD HH:MM:SS"; the command line of this process (/proc/self/cmdline, or "").
std::string utc_now();
std::string this_command_line();

void print_report(const BenchReport& r, std::FILE* out);
nlohmann::json report_json(const BenchReport& r);
void write_report_json(const BenchReport& r, const std::string& path);

}  // namespace m3::bench
