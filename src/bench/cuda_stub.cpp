// Builds without CUDA: the harness entry points say so (cuda_bench.h). With M3_CUDA the real
// definitions live in bench/cuda/ and this file compiles to nothing.
#include "bench/cuda_bench.h"
#include "core/check.h"

#if !M3_WITH_CUDA
namespace m3::bench {
bool cuda_bench_available() { return false; }
BenchReport run_cuda_bench(const BenchOptions&) {
  M3_FAIL("bench: --device cuda: this build has no CUDA (configure with -DM3_CUDA=ON), use --device cpu");
}
}  // namespace m3::bench
#endif
