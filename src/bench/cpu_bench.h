// The CPU smoke mode of `m3mono bench --device cpu`: the CPU reference engine (ref/engine.h) on
// random synthetic weights of a small spec, timed per step with the host clock. It exercises the
// whole framework (cases, byte accounting, floor, statistics, table, JSON) so the bench never rots
// in CI; its figures say nothing about GPU performance. The floor's bandwidth is a host memcpy.
#pragma once
#include "bench/bench_options.h"
#include "bench/report.h"

namespace m3::bench {

BenchReport run_cpu_bench(const BenchOptions& o);

// Host copy bandwidth (memcpy of `bytes`, median of `reps`; read + write bytes counted), GB/s.
double host_copy_GBps(size_t bytes, int reps);

}  // namespace m3::bench
