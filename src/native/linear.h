// Linear layers of the native path over prepared weights, any number of tokens M:
//   linear_fp8  : y[t, n] = s_n * sum_k e4m3(W[n, k]) x[t, k]   (FP8 row-scaled, attention q/k/v/o)
//   linear_dense: y[t, n] = sum_k W[n, k] x[t, k]                 (BF16 lm_head / dense MLP, F32|BF16 router)
//   dense_mlp   : h = swiglu_oai(gate/up interleaved rows) [M, I], out = W_down h
// FP8 and BF16 weights run the tensor-core kernel (kernels/mma_linear.cuh) for every M: fp32
// activations are split into bf16 hi + lo (both multiplied), fp32 accumulation, and a row's result
// is bitwise independent of M and of the other rows (the K split and the order partial sums are
// added in depend on N, K and the device's SM count only). F32 weights (the router) and
// LinearPath::Gemv run the CUDA-core weight-streaming GEMV (kernels/gemv.cuh), whose per-row
// order does not depend on M either. No cuBLAS. All pointers are device pointers; outputs fp32.
// Asynchronous on `stream`.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/gemv_params.h"
#include "kernels/mma_params.h"
#include "native/launch.h"

namespace m3::native {

// codes [rows][ld bytes] (ld % 16 == 0, zero past cols) + fp32 scales [rows]; tiled: the codes in
// the prepared arena's 16-row tiles (core/weight_tiles.h: ld % 64 == 0, tiled_rows(rows) rows
// stored), the same sums and bits as row-major.
// MXFP8 (mx set, scales null): the codes scaled per 32 elements of a row by E8M0 bytes mx[row][ld_mx]
// (2^(byte - 127), bytes 4 .. 134: kernels/mma_params.h), no row scale.
struct Fp8Weight {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int rows = 0, cols = 0;
  int64_t ld = 0;
  bool tiled = false;
  const uint8_t* mx = nullptr;
  int64_t ld_mx = 0;
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

// Tokens per pass of the CUDA-core GEMV (more tokens run in further passes over the same rows).
inline constexpr int kGemvMaxM = 16;
// Auto and Gemm: the tensor-core kernel (FP8 / BF16 weights; F32 weights take the GEMV).
// Gemv: the CUDA-core GEMV for any M (the router; the bench's comparison; row-major weights only).
enum class LinearPath { Auto, Gemv, Gemm };

// make + launch (the plan builds the params itself: make_mma_linear_params / make_gemv_params).
void linear_fp8(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                LinearPath path = LinearPath::Auto);
void linear_dense(const DenseWeight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                  LinearPath path = LinearPath::Auto);
// gate_up: BF16 [2I][H] rows interleaved (2j gate, 2j+1 up); down: BF16 [H][I].
// h: [M][ld_h] fp32 scratch the caller owns (I columns); out [M][ld_out].
void dense_mlp(const DenseWeight& gate_up, const DenseWeight& down, const ActIn& x, int M, float alpha, float limit,
               float* h, int64_t ld_h, float* out, int64_t ld_out, cudaStream_t stream,
               LinearPath path = LinearPath::Auto);

// The GEMV alone with an optional SwiGLU epilogue over interleaved rows (y gets rows/2 columns).
void gemv(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
          float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream);

// Tiling of the tensor-core kernel: tiles of 16*rt weight rows x 8*nt tokens; deep: one warp walks
// all K chains of its tile (prefill), else one CTA of P warps walks them in parallel (decode).
// Every tiling gives bitwise the same rows (tested); rt = 0 picks by shape (mma_tiling_for).
// Instantiated: wide (1,1) (1,2) (2,1) (2,2) (4,1), deep (4,4).
struct MmaTiling {
  int rt = 0, nt = 0;
  bool deep = false;
  // The decode tile (1 x 1 wide) of FP8 weights: 1 streamed by a producer warp (kernels/mma_stream.cuh),
  // 0 each warp loads its own (the register walk), -1 the default (mma_stream_default). The same bits.
  int stream = -1;
};
// Whether native's decode tiles stream by default: no, unless the environment sets M3_MMA_STREAM=1
// (read once; for side-by-side measurements). The mono kernel chooses for itself (TablePlacement).
bool mma_stream_default();
constexpr int kMmaDecodeRows = 8;  // tokens up to which mma_tiling_for picks the decode tile
MmaTiling mma_tiling_for(int N, int K, int M);
int mma_chains(int N, int K);  // P on the current device (kernels/mma_linear.cuh)
// The tensor-core kernel alone (FP8 with its row scales, or BF16 weights), optional SwiGLU
// epilogue over interleaved rows.
void mma_linear(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
                float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream,
                MmaTiling tiling = {});

// Parameter builders (all the checks; a refusal names the op, the tensor and what is wrong) and
// their launches. w: [N x K] weights of wdtype (16-byte aligned rows of ld_w bytes >= K elements),
// FP8 weights with their row scales.
kernels::GemvParams make_gemv_params(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K,
                                     const ActIn& x, int M, float* y, int64_t ld_y, bool swiglu, float alpha,
                                     float limit);
kernels::MmaLinearParams make_mma_linear_params(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N,
                                                int K, const ActIn& x, int M, float* y, int64_t ld_y, bool swiglu,
                                                float alpha, float limit, MmaTiling tiling = {});
// The FP8 or MXFP8 projection (either layout of Fp8Weight) on the tensor-core kernel.
kernels::MmaLinearParams make_fp8_linear_params(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y,
                                                MmaTiling tiling = {});
void launch(const kernels::GemvParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MmaLinearParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

// The FP8 decode tile (1 x 1, the register walk, row-scaled FP8 weights, fp32 x) reading its
// activations already split into bf16 hi / lo (ActFmt::F32Split, kernels/act_split.cuh) at xs
// ([M][2 ld_x] bf16, 16-byte aligned), which x's producer writes: instead of every item splitting
// every element it reads. True, and p switched to xs, where p is that tile and
// split_activations_enabled(); false and p unchanged otherwise. The same bits either way.
bool use_split_activations(kernels::MmaLinearParams& p, const void* xs);
// On unless the environment sets M3_SPLIT_ACT=0 (read once; for side-by-side measurements);
// set_split_activations overrides it for the plans built from then on (0 off, 1 on, -1 back to
// the environment's).
bool split_activations_enabled();
void set_split_activations(int on);

}  // namespace m3::native
