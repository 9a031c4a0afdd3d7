// cuBLASLt reference matmuls for the benchmarks (lt_matmul.cpp):
//   Fp8Matmul: y[M][N] (bf16) = (a_n * b_t) * sum_k W[n][k] x[t][k], W and x FP8 E4M3 (the "TN"
//     layout cuBLASLt's FP8 kernels require: W row-major [N][ldw], x row-major [M][ldx]); scales
//     per output row of W and per token (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) when this
//     cuBLASLt offers an algorithm for it, else one fp32 scale per tensor (note() says which).
//   Bf16Matmul: C[M][N] = A[M][K] B[N][K]^T in bf16 with fp32 accumulation (the tensor-core
//     rate the prefill fraction is taken against).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace m3::bench {

class Fp8Matmul {
 public:
  Fp8Matmul(int N, int K, int M, int64_t ldw, int64_t ldx);  // throws when cuBLASLt has no algorithm
  ~Fp8Matmul();
  Fp8Matmul(const Fp8Matmul&) = delete;
  Fp8Matmul& operator=(const Fp8Matmul&) = delete;
  // w_scale [N], x_scale [M] (outer-vector mode) or [1] each (tensor-wide mode); y [M][N] bf16.
  void run(const uint8_t* w, const float* w_scale, const uint8_t* x, const float* x_scale, uint16_t* y,
           cudaStream_t s);
  bool outer_vec() const { return outer_; }
  std::string note() const;

 private:
  void* handle_ = nullptr;
  void* desc_ = nullptr;
  void* la_ = nullptr;
  void* lb_ = nullptr;
  void* lc_ = nullptr;
  void* algo_ = nullptr;  // cublasLtMatmulAlgo_t
  void* ws_ = nullptr;
  size_t ws_bytes_ = size_t(32) << 20;
  bool outer_ = false;
};

// TFLOP/s of an n x n x n bf16 matmul on random data (median of `reps` after warm-up).
double bf16_matmul_tflops(int n, int reps, cudaStream_t s);

}  // namespace m3::bench
