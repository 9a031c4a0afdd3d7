// cuBLASLt FP8 and BF16 reference matmuls (lt_matmul.h).
#include "bench/cuda/lt_matmul.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <vector>

#include "bench/cuda/probes.h"
#include "bench/stats.h"
#include "native/cuda_check.h"

#define M3_LT_CHECK(expr)                                                              \
  do {                                                                                 \
    cublasStatus_t _s = (expr);                                                        \
    M3_CHECK(_s == CUBLAS_STATUS_SUCCESS, "cuBLASLt error {} in {}", int(_s), #expr);  \
  } while (0)

namespace m3::bench {

namespace {

bool pick_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
               cublasLtMatrixLayout_t c, size_t ws, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  M3_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  M3_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res{};
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n == 0) return false;
  *out = res.algo;
  return true;
}

}  // namespace

Fp8Matmul::Fp8Matmul(int N, int K, int M, int64_t ldw, int64_t ldx) {
  cublasLtHandle_t h = nullptr;
  M3_LT_CHECK(cublasLtCreate(&h));
  handle_ = h;
  M3_CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  // column-major views: W^T is K x N (ld ldw), x^T is K x M (ld ldx), y^T is N x M (ld N)
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), ldw));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), ldx));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, uint64_t(N), uint64_t(M), N));
  la_ = a;
  lb_ = b;
  lc_ = c;
  auto* algo = new cublasLtMatmulAlgo_t{};
  algo_ = algo;
  for (int outer = 1; outer >= 0; --outer) {
    cublasLtMatmulDesc_t d = nullptr;
    M3_LT_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    if (pick_algo(h, d, a, b, c, ws_bytes_, algo)) {
      desc_ = d;
      outer_ = outer;
      return;
    }
    cublasLtMatmulDescDestroy(d);
  }
  M3_FAIL("bench: cuBLASLt has no FP8 algorithm for N {} K {} M {}", N, K, M);
}

Fp8Matmul::~Fp8Matmul() {
  if (desc_) cublasLtMatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(desc_));
  if (la_) cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(la_));
  if (lb_) cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(lb_));
  if (lc_) cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(lc_));
  delete static_cast<cublasLtMatmulAlgo_t*>(algo_);
  if (ws_) cudaFree(ws_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void Fp8Matmul::run(const uint8_t* w, const float* w_scale, const uint8_t* x, const float* x_scale, uint16_t* y,
                    cudaStream_t s) {
  auto d = static_cast<cublasLtMatmulDesc_t>(desc_);
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof w_scale));
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof x_scale));
  const float alpha = 1, beta = 0;
  auto c = static_cast<cublasLtMatrixLayout_t>(lc_);
  M3_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), d, &alpha, w,
                             static_cast<cublasLtMatrixLayout_t>(la_), x, static_cast<cublasLtMatrixLayout_t>(lb_),
                             &beta, y, c, y, c, static_cast<const cublasLtMatmulAlgo_t*>(algo_), ws_, ws_bytes_, s));
}

std::string Fp8Matmul::note() const {
  return outer_ ? "cuBLASLt FP8 E4M3 x E4M3 -> BF16, fp32 scales per weight row and per token (OUTER_VEC_32F)"
                : "cuBLASLt FP8 E4M3 x E4M3 -> BF16, one fp32 scale per tensor (no OUTER_VEC_32F algorithm here)";
}

double bf16_matmul_tflops(int n, int reps, cudaStream_t s) {
  cublasLtHandle_t h = nullptr;
  M3_LT_CHECK(cublasLtCreate(&h));
  const size_t elems = size_t(n) * size_t(n);
  void *A = nullptr, *B = nullptr, *C = nullptr, *ws = nullptr;
  const size_t wsb = size_t(32) << 20;
  M3_CUDA_CHECK(cudaMalloc(&A, elems * 2));
  M3_CUDA_CHECK(cudaMalloc(&B, elems * 2));
  M3_CUDA_CHECK(cudaMalloc(&C, elems * 2));
  M3_CUDA_CHECK(cudaMalloc(&ws, wsb));
  fill_random(A, 1, int64_t(elems * 2), int64_t(elems * 2), FillFormat::Bf16, -1, 1, 11, s);
  fill_random(B, 1, int64_t(elems * 2), int64_t(elems * 2), FillFormat::Bf16, -1, 1, 12, s);
  cublasLtMatmulDesc_t d = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  M3_LT_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  M3_LT_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n));
  M3_LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
  cublasLtMatmulAlgo_t algo{};
  const bool ok = pick_algo(h, d, la, lb, lc, wsb, &algo);
  double tflops = 0;
  if (ok) {
    const float alpha = 1, beta = 0;
    auto run = [&] {
      M3_LT_CHECK(cublasLtMatmul(h, d, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &algo, ws, wsb, s));
    };
    for (int i = 0; i < 3; ++i) run();
    cudaEvent_t e0, e1;
    M3_CUDA_CHECK(cudaEventCreate(&e0));
    M3_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      M3_CUDA_CHECK(cudaEventRecord(e0, s));
      run();
      M3_CUDA_CHECK(cudaEventRecord(e1, s));
      M3_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      M3_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(double(ms) * 1e-3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    tflops = 2.0 * double(n) * n * n / summarize(t).median / 1e12;
  }
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(d);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaFree(ws);
  cublasLtDestroy(h);
  M3_CHECK(ok, "bench: cuBLASLt has no bf16 algorithm for {}^3", n);
  return tflops;
}

}  // namespace m3::bench
