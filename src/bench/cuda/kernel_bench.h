// Per-kernel benches (kernel_bench.cpp), each against a plain cold read of the same bytes in the
// same run (same launch count, rotating over copies larger than the L2 so nothing is cached):
//   fp8_mma  : native::linear_fp8 (the tensor-core kernel, any M) on the fused q|k|v|iq|ik and O
//              shapes of tp 1 and tp 4 in the arena's tiled layout, and cuBLASLt FP8 on the same
//              shapes (lt_matmul.h); fp8_mma_rows: the same codes row-major (same bits);
//              fp8_mma_split: the tiled layout over x split into bf16 hi / lo by its producer
//              (native::use_split_activations: the plans' qkv and O at M <= 8);
//   fp8_gemv : the same through the CUDA-core GEMV (LinearPath::Gemv, M <= 16);
//   moe_mxfp4: native::moe_forward on a real MoE layer (tp 1 and tp 4), bytes = router + the
//              experts its routing actually hit (read back) + the shared expert; then the same
//              split into its stages (moe:router, moe:select, ... moe:combine), each against the
//              plain read of its own bytes (or one empty kernel when it reads no weights).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "bench/report.h"

namespace m3::bench {

struct KernelBenchOptions {
  std::vector<int> Ms{1, 2, 4, 8, 16};
  std::vector<int> tps{1, 4};
  int warmup = 5, reps = 30;  // graph replays of one rotation
  uint64_t seed = 1;
  bool cublas = true;
  bool moe_stages = true;  // moe_mxfp4: also time each stage of moe_forward (rows "moe:<stage>")
};

std::vector<KernelResult> bench_fp8_gemv(const KernelBenchOptions& o, cudaStream_t s);
std::vector<KernelResult> bench_moe(const KernelBenchOptions& o, cudaStream_t s);

// Median time of one launch of a rotation: fn(i, s) for i in [0, n) captured into one graph.
double rotation_us(int n, const std::function<void(int, cudaStream_t)>& fn, int warmup, int reps, cudaStream_t s);

}  // namespace m3::bench
