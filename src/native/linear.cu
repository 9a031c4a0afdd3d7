// Launchers of the linear layers (native/linear.h): the tensor-core kernel (kernels/mma_linear.cuh)
// in its wide (decode: one CTA of P warps per tile) and deep (prefill: one warp per tile) modes,
// and the CUDA-core GEMV (kernels/gemv.cuh), one block per work item.
#include <algorithm>

#include "kernels/gemv.cuh"
#include "kernels/mma_linear.cuh"
#include "native/cuda_check.h"
#include "native/linear.h"

namespace m3::native {

using kernels::ActFmt;
using kernels::WeightFmt;

namespace {

template <WeightFmt W, ActFmt X, int MT>
__global__ void __launch_bounds__(kernels::kGemvThreads) gemv_kernel(kernels::GemvParams p) {
  __shared__ float smem[kernels::gemv_smem_floats<MT>()];
  // block (x, y): rows of work item x for tokens [y * MT, y * MT + MT) (all tokens when gridDim.y is 1)
  const int tb = gridDim.y == 1 ? 0 : int(blockIdx.y) * MT;
  const int te = gridDim.y == 1 ? p.M : min(p.M, tb + MT);
  kernels::gemv_work<W, X, MT>(p, blockIdx.x, threadIdx.x, smem, tb, te);
}

template <WeightFmt W, ActFmt X>
void launch_gemv(const kernels::GemvParams& p, cudaStream_t s) {
  const int mt = p.M <= 1 ? 1 : p.M <= 2 ? 2 : p.M <= 4 ? 4 : p.M <= 8 ? 8 : 16;
  // more tokens than one pass: one block per (work item, MT tokens) instead of every block walking
  // all M (the F32 router over an 8K-token prefill took 16.8 ms a layer on an H200 that way)
  const int groups = (p.M + mt - 1) / mt;
  M3_CHECK(groups < 65536, "gemv: {} tokens in one call (at most {})", p.M, 65535 * 16);
  const dim3 grid(unsigned(kernels::gemv_work_items(p.N, mt)), unsigned(groups));
  switch (mt) {
    case 1: gemv_kernel<W, X, 1><<<grid, kernels::kGemvThreads, 0, s>>>(p); break;
    case 2: gemv_kernel<W, X, 2><<<grid, kernels::kGemvThreads, 0, s>>>(p); break;
    case 4: gemv_kernel<W, X, 4><<<grid, kernels::kGemvThreads, 0, s>>>(p); break;
    case 8: gemv_kernel<W, X, 8><<<grid, kernels::kGemvThreads, 0, s>>>(p); break;
    default: gemv_kernel<W, X, 16><<<grid, kernels::kGemvThreads, 0, s>>>(p); break;
  }
  M3_LAUNCH_CHECK(s);
}

template <WeightFmt W>
void launch_gemv_x(const kernels::GemvParams& p, DType xt, cudaStream_t s) {
  if (xt == DType::BF16) launch_gemv<W, ActFmt::BF16>(p, s);
  else launch_gemv<W, ActFmt::F32>(p, s);
}

void check_act(const ActIn& x, int K, int M, const char* what) {
  M3_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "{}: activations must be BF16 or F32, got {}", what,
           dtype_name(x.dtype));
  M3_CHECK(x.data && M > 0, "{}: no activations (M = {})", what, M);
  const int64_t align = x.dtype == DType::BF16 ? 8 : 4;
  M3_CHECK(x.ld >= K && x.ld % align == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0,
           "{}: activation rows must be 16-byte aligned with ld >= K (ld {}, K {})", what, x.ld, K);
}

// The weight [N x K] (16-byte aligned rows of ld_w >= K elements), FP8 row scales, and the output.
void check_weight_out(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const float* y,
                      int64_t ld_y, bool swiglu, const char* what) {
  const int64_t esize = wdtype == DType::F8_E4M3 ? 1 : int64_t(dtype_size(wdtype));
  M3_CHECK(w && N > 0 && K > 0 && ld_w % 16 == 0 && ld_w >= K * esize && reinterpret_cast<uintptr_t>(w) % 16 == 0,
           "{}: weight [{} x {}] {} needs 16-byte aligned rows of ld >= {} bytes (ld {})", what, N, K,
           dtype_name(wdtype), K * esize, ld_w);
  M3_CHECK(wdtype != DType::F8_E4M3 || w_scale, "{}: FP8 weights need their row scales", what);
  M3_CHECK(!swiglu || N % 2 == 0, "{}: SwiGLU needs an even row count, got {}", what, N);
  M3_CHECK(y && ld_y >= (swiglu ? N / 2 : N), "{}: output ld {} < {}", what, ld_y, swiglu ? N / 2 : N);
}

// ---- tensor-core kernel ----

using kernels::MmaLinearParams;

template <WeightFmt W, ActFmt X, int RT, int NT>
__global__ void __launch_bounds__(kernels::kMmaMaxChains * 32, 1) mma_wide_kernel(MmaLinearParams p) {
  extern __shared__ float smem[];
  kernels::mma_linear_wide_work<W, X, RT, NT>(p, int(blockIdx.x), int(blockIdx.y), int(threadIdx.x), smem);
}
// The decode tile (1 x 1) is held to 72 registers: 28 warps per SM, so two CTAs of up to 14 warps
// share an SM (mma_linear_chains aims at 14 warps per SM: one wave).
template <WeightFmt W, ActFmt X>
__global__ void __maxnreg__(72) mma_decode_kernel(MmaLinearParams p) {
  extern __shared__ float smem[];
  kernels::mma_linear_wide_work<W, X, 1, 1>(p, int(blockIdx.x), int(blockIdx.y), int(threadIdx.x), smem);
}

template <WeightFmt W, ActFmt X, int RT, int NT>
__global__ void __launch_bounds__(kernels::kMmaDeepWarps * 32, 1) mma_deep_kernel(MmaLinearParams p, int tiles_n) {
  constexpr int kPerWarp = kernels::mma::deep_smem_floats_per_warp<RT, NT>();
  __shared__ float smem[kernels::kMmaDeepWarps * kPerWarp];
  const int warp = int(threadIdx.x) >> 5;
  const int tile_n = int(blockIdx.x) * kernels::kMmaDeepWarps + warp;
  if (tile_n >= tiles_n) return;  // the deep work has no block barrier
  kernels::mma_linear_deep_work<W, X, RT, NT>(p, tile_n, int(blockIdx.y), int(threadIdx.x) & 31, smem + warp * kPerWarp);
}

template <WeightFmt W, ActFmt X, int RT, int NT>
void launch_wide(const MmaLinearParams& p, cudaStream_t s) {
  const dim3 grid(unsigned((p.N + 16 * RT - 1) / (16 * RT)), unsigned((p.M + 8 * NT - 1) / (8 * NT)));
  const size_t smem = size_t(kernels::mma::wide_smem_floats<RT, NT>(p.chains)) * sizeof(float);
  static_assert(size_t(kernels::mma::wide_smem_floats<RT, NT>(kernels::kMmaMaxChains)) * 4 <= 48 * 1024,
                "wide tile needs more than the default shared memory");
  if constexpr (RT == 1 && NT == 1) mma_decode_kernel<W, X><<<grid, unsigned(32 * p.chains), smem, s>>>(p);
  else mma_wide_kernel<W, X, RT, NT><<<grid, unsigned(32 * p.chains), smem, s>>>(p);
  M3_LAUNCH_CHECK(s);
}

template <WeightFmt W, ActFmt X, int RT, int NT>
void launch_deep(const MmaLinearParams& p, cudaStream_t s) {
  const int tiles_n = (p.N + 16 * RT - 1) / (16 * RT);
  const dim3 grid(unsigned((tiles_n + kernels::kMmaDeepWarps - 1) / kernels::kMmaDeepWarps),
                  unsigned((p.M + 8 * NT - 1) / (8 * NT)));
  mma_deep_kernel<W, X, RT, NT><<<grid, unsigned(32 * kernels::kMmaDeepWarps), 0, s>>>(p, tiles_n);
  M3_LAUNCH_CHECK(s);
}

template <WeightFmt W, ActFmt X>
void launch_mma(const MmaLinearParams& p, MmaTiling t, cudaStream_t s) {
  if (t.deep) {
    if (t.rt == 4 && t.nt == 4) return launch_deep<W, X, 4, 4>(p, s);
  } else {
    if (t.rt == 1 && t.nt == 1) return launch_wide<W, X, 1, 1>(p, s);
    if (t.rt == 1 && t.nt == 2) return launch_wide<W, X, 1, 2>(p, s);
    if (t.rt == 2 && t.nt == 1) return launch_wide<W, X, 2, 1>(p, s);
    if (t.rt == 2 && t.nt == 2) return launch_wide<W, X, 2, 2>(p, s);
    if (t.rt == 4 && t.nt == 1) return launch_wide<W, X, 4, 1>(p, s);
  }
  M3_FAIL("mma_linear: no {} tiling rt {} nt {}", t.deep ? "deep" : "wide", t.rt, t.nt);
}

}  // namespace

LinearContext::~LinearContext() {
  for (void* b : bufs_)
    if (b) cudaFree(b);
}
void* LinearContext::scratch(int which, size_t bytes) {
  M3_CHECK(which >= 0 && which < 4, "LinearContext::scratch: slot {} out of range", which);
  if (sizes_[which] < bytes) {
    if (bufs_[which]) M3_CUDA_CHECK(cudaFree(bufs_[which]));
    bufs_[which] = nullptr;
    M3_CUDA_CHECK(cudaMalloc(&bufs_[which], bytes));
    sizes_[which] = bytes;
  }
  return bufs_[which];
}

void gemv(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
          float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream) {
  check_act(x, K, M, "gemv");
  check_weight_out(w, wdtype, w_scale, ld_w, N, K, y, ld_y, swiglu, "gemv");
  kernels::GemvParams p;
  p.w = static_cast<const uint8_t*>(w);
  p.w_scale = w_scale;
  p.ld_w = ld_w;
  p.x = x.data;
  p.ld_x = x.ld;
  p.y = y;
  p.ld_y = ld_y;
  p.N = N;
  p.K = K;
  p.M = M;
  p.swiglu = swiglu ? 1 : 0;
  p.alpha = alpha;
  p.limit = limit;
  switch (wdtype) {
    case DType::F8_E4M3: return launch_gemv_x<WeightFmt::FP8>(p, x.dtype, stream);
    case DType::BF16: return launch_gemv_x<WeightFmt::BF16>(p, x.dtype, stream);
    case DType::F32: return launch_gemv_x<WeightFmt::F32>(p, x.dtype, stream);
    default: M3_FAIL("gemv: unsupported weight dtype {}", dtype_name(wdtype));
  }
}

int mma_chains(int N, int K) { return kernels::mma_linear_chains(N, K, device_sm_count()); }

// Picked from a sweep on the H200 (tests/gpu/test_mma_linear.cpp, GpuMmaLinearBench): decode
// 1 x 1 (one wave of CTAs over all row tiles); 2 x 2 from 9 tokens (weights and activations each
// reused twice from registers); deep 4 x 4 once there are enough 64 x 32 tiles to fill the device.
MmaTiling mma_tiling_for(int N, int K, int M) {
  (void)K;
  if (M <= 8) return {1, 1, false};
  const int64_t deep_tiles = int64_t((N + 63) / 64) * ((M + 31) / 32);
  if (M > 64 && deep_tiles >= int64_t(4) * device_sm_count()) return {4, 4, true};
  return {2, 2, false};
}

void mma_linear(const void* w, DType wdtype, const float* w_scale, int64_t ld_w, int N, int K, const ActIn& x, int M,
                float* y, int64_t ld_y, bool swiglu, float alpha, float limit, cudaStream_t stream, MmaTiling tiling) {
  check_act(x, K, M, "mma_linear");
  M3_CHECK(wdtype == DType::F8_E4M3 || wdtype == DType::BF16, "mma_linear: weights must be F8_E4M3 or BF16, got {}",
           dtype_name(wdtype));
  check_weight_out(w, wdtype, w_scale, ld_w, N, K, y, ld_y, swiglu, "mma_linear");
  M3_CHECK(M <= 65535 * 8, "mma_linear: M {} too large for one launch", M);
  MmaLinearParams p;
  p.w = static_cast<const uint8_t*>(w);
  p.w_scale = w_scale;
  p.ld_w = ld_w;
  p.x = x.data;
  p.ld_x = x.ld;
  p.y = y;
  p.ld_y = ld_y;
  p.N = N;
  p.K = K;
  p.M = M;
  p.chains = mma_chains(N, K);
  p.swiglu = swiglu ? 1 : 0;
  p.alpha = alpha;
  p.limit = limit;
  if (tiling.rt == 0) tiling = mma_tiling_for(N, K, M);
  if (wdtype == DType::F8_E4M3) {
    if (x.dtype == DType::BF16) launch_mma<WeightFmt::FP8, ActFmt::BF16>(p, tiling, stream);
    else launch_mma<WeightFmt::FP8, ActFmt::F32>(p, tiling, stream);
  } else {
    if (x.dtype == DType::BF16) launch_mma<WeightFmt::BF16, ActFmt::BF16>(p, tiling, stream);
    else launch_mma<WeightFmt::BF16, ActFmt::F32>(p, tiling, stream);
  }
}

void linear_fp8(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                LinearContext* ctx, LinearPath path) {
  (void)ctx;
  if (path == LinearPath::Gemv)
    gemv(w.codes, DType::F8_E4M3, w.scales, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
  else
    mma_linear(w.codes, DType::F8_E4M3, w.scales, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
}

void linear_dense(const DenseWeight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                  LinearContext* ctx, LinearPath path) {
  (void)ctx;
  if (path == LinearPath::Gemv || w.dtype == DType::F32)
    gemv(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
  else
    mma_linear(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
}

void dense_mlp(const DenseWeight& gate_up, const DenseWeight& down, const ActIn& x, int M, float alpha, float limit,
               float* h, int64_t ld_h, float* out, int64_t ld_out, cudaStream_t stream, LinearContext* ctx,
               LinearPath path) {
  const int I = gate_up.rows / 2;
  M3_CHECK(gate_up.rows % 2 == 0 && down.cols == I && down.rows == gate_up.cols,
           "dense_mlp: gate_up [{} x {}] and down [{} x {}] do not match", gate_up.rows, gate_up.cols, down.rows,
           down.cols);
  M3_CHECK(ld_h >= I && ld_h % 4 == 0, "dense_mlp: h ld {} must be >= {} and a multiple of 4", ld_h, I);
  if (path == LinearPath::Gemv || gate_up.dtype == DType::F32)
    gemv(gate_up.data, gate_up.dtype, nullptr, gate_up.ld, gate_up.rows, gate_up.cols, x, M, h, ld_h, true, alpha,
         limit, stream);
  else
    mma_linear(gate_up.data, gate_up.dtype, nullptr, gate_up.ld, gate_up.rows, gate_up.cols, x, M, h, ld_h, true,
               alpha, limit, stream);
  ActIn hin{h, DType::F32, ld_h};
  linear_dense(down, hin, M, out, ld_out, stream, ctx, path);
}

}  // namespace m3::native
