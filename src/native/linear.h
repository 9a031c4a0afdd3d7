// Linear layers of the native path over prepared weights, any number of tokens M:
//   linear_fp8  : y[t, n] = s_n * sum_k e4m3(W[n, k]) x[t, k]   (FP8 row-scaled, attention q/k/v/o)
//   linear_dense: y[t, n] = sum_k W[n, k] x[t, k]                 (BF16 lm_head / dense MLP, F32|BF16 router)
//   dense_mlp   : h = swiglu_oai(gate/up interleaved rows) [M, I], out = W_down h
// Up to kGemvMaxM tokens run the weight-streaming GEMV (kernels/gemv.cuh); more run a GEMM
// (cuBLASLt bf16 with fp32 accumulation and output; FP8 weights are decoded to bf16 exactly in row
// chunks first and the row scale is applied to the fp32 result; fp32 activations are rounded to
// bf16 for the GEMM). F32 weights (the router) always take the GEMV, in passes of 16 tokens.
// All pointers are device pointers; outputs fp32. Asynchronous on `stream`.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace m3::native {

struct Fp8Weight {  // codes [rows][ld bytes] (ld % 16 == 0, zero past cols) + fp32 scales [rows]
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int rows = 0, cols = 0;
  int64_t ld = 0;
};
struct DenseWeight {  // BF16 or F32 [rows][ld bytes] (ld % 16 == 0, zero past cols)
  const void* data = nullptr;
  DType dtype = DType::BF16;
  int rows = 0, cols = 0;
  int64_t ld = 0;
};
struct ActIn {  // activations [M][ld elements], BF16 or F32, rows 16-byte aligned
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;
};

inline constexpr int kGemvMaxM = 16;
enum class LinearPath { Auto, Gemv, Gemm };

// cuBLASLt handle, its workspace and scratch for the GEMM path (decoded weight chunks, bf16
// activations, fp32 gate/up). Scratch grows on first use of a larger shape: run each shape once
// eagerly before capturing a graph. One context per stream.
class LinearContext {
 public:
  LinearContext();
  ~LinearContext();
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;
  void* scratch(int which, size_t bytes);  // which: 0..3, device buffers kept between calls
  void* lt_handle() const { return handle_; }
  void* algo_cache() const { return cache_; }  // cuBLASLt algorithms by GEMM shape (linear.cu)
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* bufs_[4] = {};
  size_t sizes_[4] = {};
  void* cache_ = nullptr;
};

void linear_fp8(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                LinearContext* ctx = nullptr, LinearPath path = LinearPath::Auto);
void linear_dense(const DenseWeight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                  LinearContext* ctx = nullptr, LinearPath path = LinearPath::Auto);
// gate_up: BF16 [2I][H] rows interleaved (2j gate, 2j+1 up); down: BF16 [H][I].
// h: [M][ld_h] fp32 scratch the caller owns (I columns); out [M][ld_out].
void dense_mlp(const DenseWeight& gate_up, const DenseWeight& down, const ActIn& x, int M, float alpha, float limit,
               float* h, int64_t ld_h, float* out, int64_t ld_out, cudaStream_t stream, LinearContext* ctx = nullptr,
               LinearPath path = LinearPath::Auto);

// The GEMV alone with an optional SwiGLU epilogue over interleaved rows (y gets rows/2 columns).
void gemv(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
          float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream);

}  // namespace m3::native
