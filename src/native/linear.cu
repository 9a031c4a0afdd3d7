// Launchers of the linear layers (native/linear.h): the GEMV kernels (kernels/gemv.cuh), one block
// per work item, and the GEMM path through cuBLASLt with the small conversion kernels it needs.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>

#include "kernels/gemv.cuh"
#include "kernels/swiglu.cuh"
#include "native/cuda_check.h"
#include "native/linear.h"

#define M3_CUBLAS_CHECK(expr)                                                     \
  do {                                                                            \
    cublasStatus_t _s = (expr);                                                   \
    M3_CHECK(_s == CUBLAS_STATUS_SUCCESS, "cuBLASLt error {} in {}", int(_s), #expr); \
  } while (0)

namespace m3::native {

using kernels::ActFmt;
using kernels::WeightFmt;

namespace {

template <WeightFmt W, ActFmt X, int MT>
__global__ void __launch_bounds__(kernels::kGemvThreads) gemv_kernel(kernels::GemvParams p) {
  __shared__ float smem[kernels::gemv_smem_floats<MT>()];
  kernels::gemv_work<W, X, MT>(p, blockIdx.x, threadIdx.x, smem);
}

template <WeightFmt W, ActFmt X>
void launch_gemv(const kernels::GemvParams& p, cudaStream_t s) {
  const int mt = p.M <= 1 ? 1 : p.M <= 2 ? 2 : p.M <= 4 ? 4 : p.M <= 8 ? 8 : 16;
  const unsigned grid = unsigned(kernels::gemv_work_items(p.N, mt));
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

// ---- GEMM path helpers ----

__global__ void f32_to_bf16_kernel(const float* x, int64_t ldx, uint16_t* y, int64_t ldy, int M, int K, int Kp) {
  const int t = blockIdx.y;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < Kp; k += gridDim.x * blockDim.x)
    y[int64_t(t) * ldy + k] = k < K ? f32_to_bf16(x[int64_t(t) * ldx + k]) : uint16_t(0);
}
__global__ void bf16_copy_kernel(const uint16_t* x, int64_t ldx, uint16_t* y, int64_t ldy, int M, int K, int Kp) {
  const int t = blockIdx.y;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < Kp; k += gridDim.x * blockDim.x)
    y[int64_t(t) * ldy + k] = k < K ? x[int64_t(t) * ldx + k] : uint16_t(0);
}
// FP8 codes of rows [0, n) -> bf16, 16 codes per thread (exact: every E4M3 value is a bf16 value;
// hardware e4m3x2 -> f16x2, then f16 -> f32 -> bf16 without rounding), no scale. Code rows are
// zero past K, so the bf16 rows [chunks * 16] come out zero-padded.
__global__ void fp8_rows_to_bf16_kernel(const uint8_t* codes, int64_t ld, uint16_t* out, int64_t ldo, int chunks) {
  const int r = blockIdx.y;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
    const uint4 v = *reinterpret_cast<const uint4*>(codes + int64_t(r) * ld + int64_t(c) * 16);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 f = kernels::wstream::fp8x2_to_float2(w[i] >> (16 * j));
        o[2 * i + j] = (__float_as_uint(f.x) >> 16) | (__float_as_uint(f.y) & 0xffff0000u);
      }
    uint4* dst = reinterpret_cast<uint4*>(out + int64_t(r) * ldo + int64_t(c) * 16);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}
__global__ void scale_cols_kernel(float* y, int64_t ldy, const float* scale, int N) {
  const int t = blockIdx.y;
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) y[int64_t(t) * ldy + n] *= scale[n];
}
__global__ void swiglu_rows_kernel(const float* gu, int64_t ldg, float* h, int64_t ldh, int I, float alpha, float limit) {
  const int t = blockIdx.y;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += gridDim.x * blockDim.x)
    h[int64_t(t) * ldh + j] = kernels::swiglu_oai_f32(gu[int64_t(t) * ldg + 2 * j], gu[int64_t(t) * ldg + 2 * j + 1],
                                                      alpha, limit);
}

dim3 rows_grid(int cols, int rows) { return dim3(unsigned(std::min((cols + 255) / 256, 64)), unsigned(rows)); }

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// x (any ActIn) -> bf16 [M][Kp] in scratch slot `which`.
const uint16_t* act_to_bf16(LinearContext& ctx, int which, const ActIn& x, int M, int K, int64_t Kp, cudaStream_t s) {
  auto* xb = static_cast<uint16_t*>(ctx.scratch(which, size_t(M) * size_t(Kp) * 2));
  // NOTE: grid.y is limited to 65535 rows per launch
  for (int t0 = 0; t0 < M; t0 += 65535) {
    const int m = std::min(65535, M - t0);
    if (x.dtype == DType::F32)
      f32_to_bf16_kernel<<<rows_grid(int(Kp), m), 256, 0, s>>>(static_cast<const float*>(x.data) + int64_t(t0) * x.ld,
                                                               x.ld, xb + int64_t(t0) * Kp, Kp, m, K, int(Kp));
    else
      bf16_copy_kernel<<<rows_grid(int(Kp), m), 256, 0, s>>>(static_cast<const uint16_t*>(x.data) + int64_t(t0) * x.ld,
                                                             x.ld, xb + int64_t(t0) * Kp, Kp, m, K, int(Kp));
    M3_LAUNCH_CHECK(s);
  }
  return xb;
}

// The heuristic's pick per GEMM shape and alignment (the query costs tens of microseconds).
using AlgoKey = std::array<int64_t, 9>;
using AlgoCache = std::map<AlgoKey, cublasLtMatmulAlgo_t>;

// Y[M][ldy] (fp32) = X[M][K] (bf16, ldx) * W[N][K]^T (bf16, ldw elements); no split-K reduction
// schemes, so the result does not depend on timing.
void gemm_bf16(LinearContext& ctx, const uint16_t* W, int64_t ldw, int N, int K, const uint16_t* X, int64_t ldx, int M,
               float* Y, int64_t ldy, cudaStream_t s) {
  auto h = static_cast<cublasLtHandle_t>(ctx.lt_handle());
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  M3_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  M3_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  M3_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  M3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(K), uint64_t(N), ldw));
  M3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(K), uint64_t(M), ldx));
  M3_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, uint64_t(N), uint64_t(M), ldy));
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = ctx.workspace_bytes();
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // the alignment each pointer really has (the heuristic otherwise assumes 256 bytes)
  auto align_of = [](const void* ptr) {
    uint32_t a = 256;
    while (a > 1 && reinterpret_cast<uintptr_t>(ptr) % a) a >>= 1;
    return a;
  };
  const uint32_t al_a = align_of(W), al_b = align_of(X), al_c = align_of(Y);
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
  uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
  M3_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
  auto& cache = *static_cast<AlgoCache*>(ctx.algo_cache());
  const AlgoKey key{N, K, M, ldw, ldx, ldy, al_a, al_b, al_c};
  auto it = cache.find(key);
  if (it == cache.end()) {
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    M3_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &res, &found));
    M3_CHECK(found > 0, "cuBLASLt: no bf16 GEMM algorithm for N {} K {} M {}", N, K, M);
    it = cache.emplace(key, res.algo).first;
  }
  const float alpha = 1.f, beta = 0.f;
  M3_CUBLAS_CHECK(cublasLtMatmul(h, op, &alpha, W, a, X, b, &beta, Y, c, Y, c, &it->second, ctx.workspace(), ws, s));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(op);
}

bool use_gemm(int M, LinearPath path) {
  return path == LinearPath::Gemm || (path == LinearPath::Auto && M > kGemvMaxM);
}

}  // namespace

LinearContext::LinearContext() {
  cublasLtHandle_t h;
  M3_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_bytes_ = size_t(32) << 20;
  M3_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  cache_ = new AlgoCache();
}
LinearContext::~LinearContext() {
  for (void* b : bufs_)
    if (b) cudaFree(b);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
  delete static_cast<AlgoCache*>(cache_);
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
  const int64_t esize = wdtype == DType::F8_E4M3 ? 1 : int64_t(dtype_size(wdtype));
  M3_CHECK(w && N > 0 && K > 0 && ld_w % 16 == 0 && ld_w >= K * esize && reinterpret_cast<uintptr_t>(w) % 16 == 0,
           "gemv: weight [{} x {}] {} needs 16-byte aligned rows of ld >= {} bytes (ld {})", N, K, dtype_name(wdtype),
           K * esize, ld_w);
  M3_CHECK(!swiglu || N % 2 == 0, "gemv: SwiGLU needs an even row count, got {}", N);
  M3_CHECK(y && ld_y >= (swiglu ? N / 2 : N), "gemv: output ld {} < {}", ld_y, swiglu ? N / 2 : N);
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
    case DType::F8_E4M3:
      M3_CHECK(w_scale, "gemv: FP8 weights need their row scales");
      return launch_gemv_x<WeightFmt::FP8>(p, x.dtype, stream);
    case DType::BF16: return launch_gemv_x<WeightFmt::BF16>(p, x.dtype, stream);
    case DType::F32: return launch_gemv_x<WeightFmt::F32>(p, x.dtype, stream);
    default: M3_FAIL("gemv: unsupported weight dtype {}", dtype_name(wdtype));
  }
}

void linear_fp8(const Fp8Weight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                LinearContext* ctx, LinearPath path) {
  if (!use_gemm(M, path)) {
    gemv(w.codes, DType::F8_E4M3, w.scales, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
    return;
  }
  M3_CHECK(ctx, "linear_fp8: M = {} takes the GEMM path, which needs a LinearContext", M);
  check_act(x, w.cols, M, "linear_fp8");
  const int64_t Kp = round_up(w.cols, 16);  // = the code row length: whole 16-code chunks
  M3_CHECK(w.ld >= Kp && w.ld % 16 == 0, "linear_fp8: code rows of {} bytes, expected >= {}", w.ld, Kp);
  const uint16_t* xb = act_to_bf16(*ctx, 0, x, M, w.cols, Kp, stream);
  // decode the weight in row chunks of about 64 MiB of bf16
  const int chunk = int(std::clamp<int64_t>((int64_t(64) << 20) / (Kp * 2) / 256 * 256, 256, 65280));
  auto* wb = static_cast<uint16_t*>(ctx->scratch(1, size_t(std::min(chunk, w.rows)) * size_t(Kp) * 2));
  for (int n0 = 0; n0 < w.rows; n0 += chunk) {
    const int nc = std::min(chunk, w.rows - n0);
    fp8_rows_to_bf16_kernel<<<rows_grid(int(Kp / 16), nc), 256, 0, stream>>>(w.codes + int64_t(n0) * w.ld, w.ld, wb,
                                                                              Kp, int(Kp / 16));
    M3_LAUNCH_CHECK(stream);
    gemm_bf16(*ctx, wb, Kp, nc, w.cols, xb, Kp, M, y + n0, ld_y, stream);
  }
  for (int t0 = 0; t0 < M; t0 += 65535) {
    const int m = std::min(65535, M - t0);
    scale_cols_kernel<<<rows_grid(w.rows, m), 256, 0, stream>>>(y + int64_t(t0) * ld_y, ld_y, w.scales, w.rows);
    M3_LAUNCH_CHECK(stream);
  }
}

void linear_dense(const DenseWeight& w, const ActIn& x, int M, float* y, int64_t ld_y, cudaStream_t stream,
                  LinearContext* ctx, LinearPath path) {
  if (!use_gemm(M, path) || w.dtype == DType::F32) {
    gemv(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, x, M, y, ld_y, false, 0, 0, stream);
    return;
  }
  M3_CHECK(ctx, "linear_dense: M = {} takes the GEMM path, which needs a LinearContext", M);
  M3_CHECK(w.dtype == DType::BF16, "linear_dense: GEMM path needs BF16 weights, got {}", dtype_name(w.dtype));
  check_act(x, w.cols, M, "linear_dense");
  const int64_t Kp = round_up(w.cols, 8);
  M3_CHECK(w.ld >= Kp * 2, "linear_dense: weight rows of {} bytes < {}", w.ld, Kp * 2);
  const uint16_t* xb = act_to_bf16(*ctx, 0, x, M, w.cols, Kp, stream);
  gemm_bf16(*ctx, static_cast<const uint16_t*>(w.data), w.ld / 2, w.rows, w.cols, xb, Kp, M, y, ld_y, stream);
}

void dense_mlp(const DenseWeight& gate_up, const DenseWeight& down, const ActIn& x, int M, float alpha, float limit,
               float* h, int64_t ld_h, float* out, int64_t ld_out, cudaStream_t stream, LinearContext* ctx,
               LinearPath path) {
  const int I = gate_up.rows / 2;
  M3_CHECK(gate_up.rows % 2 == 0 && down.cols == I && down.rows == gate_up.cols,
           "dense_mlp: gate_up [{} x {}] and down [{} x {}] do not match", gate_up.rows, gate_up.cols, down.rows,
           down.cols);
  M3_CHECK(ld_h >= I && ld_h % 4 == 0, "dense_mlp: h ld {} must be >= {} and a multiple of 4", ld_h, I);
  if (!use_gemm(M, path)) {
    gemv(gate_up.data, gate_up.dtype, nullptr, gate_up.ld, gate_up.rows, gate_up.cols, x, M, h, ld_h, true, alpha,
         limit, stream);
  } else {
    M3_CHECK(ctx, "dense_mlp: M = {} takes the GEMM path, which needs a LinearContext", M);
    auto* gu = static_cast<float*>(ctx->scratch(2, size_t(M) * size_t(gate_up.rows) * 4));
    linear_dense(gate_up, x, M, gu, gate_up.rows, stream, ctx, LinearPath::Gemm);
    for (int t0 = 0; t0 < M; t0 += 65535) {
      const int m = std::min(65535, M - t0);
      swiglu_rows_kernel<<<rows_grid(I, m), 256, 0, stream>>>(gu + int64_t(t0) * gate_up.rows, gate_up.rows,
                                                              h + int64_t(t0) * ld_h, ld_h, I, alpha, limit);
      M3_LAUNCH_CHECK(stream);
    }
  }
  ActIn hin{h, DType::F32, ld_h};
  linear_dense(down, hin, M, out, ld_out, stream, ctx, path);
}

}  // namespace m3::native
