// The CUDA harness of `m3mono bench --device cuda` (bench/cuda/*, built only with M3_CUDA):
// bandwidth probes, whole-step cases of the registered step paths inside CUDA graphs, and
// per-kernel benches against plain reads and cuBLASLt. Plain C++ header (no CUDA include).
#pragma once
#include "bench/bench_options.h"
#include "bench/report.h"

namespace m3::bench {

// True when this build has the CUDA harness (M3_WITH_CUDA).
bool cuda_bench_available();
// Throws when !cuda_bench_available().
BenchReport run_cuda_bench(const BenchOptions& o);

// Chart: runs `python3 <bench_chart.py> json png`. The script is $M3_BENCH_CHART, else
// ./tools/bench_chart.py, else <source dir>/tools/bench_chart.py. Returns the exit status.
int run_chart_script(const std::string& json_path, const std::string& png_path);

}  // namespace m3::bench
