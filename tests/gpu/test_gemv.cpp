// FP8 / BF16 / F32 linear layers and the dense MLP on the GPU (native/linear.h) against the CPU
// reference (ref::linear, ref::mlp_forward: double accumulation) on the SAME dequantized weights and
// bf16-exact activations, so only the fp32 accumulation order differs. Real MiniMax-M3 shapes (fused
// q|k|v|index rows 9856 x 6144, TP-4 rows 2560, O 6144 x 8192 / 2048, dense MLP, router, lm_head
// slices) and odd ones (257 x 333), token counts 1..64 (GEMV up to 16, GEMM above). Outputs are
// poisoned with NaN first; every element is checked and the worst printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/parallel.h"
#include "model/quantize.h"
#include "native/linear.h"
#include "ref/linear.h"
#include "ref/mlp.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

// max over outputs of sum_k |W[n,k] x[t,k]|: the scale of fp32 accumulation error.
double abs_dot_max(const Mat& w, const std::vector<float>& x, int M, int64_t ld) {
  std::vector<double> row_max(size_t(w.rows), 0.0);
  pool().parallel_for(w.rows, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      for (int t = 0; t < M; ++t) {
        double s = 0;
        const float* r = w.row(int(n));
        for (int k = 0; k < w.cols; ++k) s += std::fabs(double(r[k]) * x[size_t(t) * ld + k]);
        row_max[size_t(n)] = std::max(row_max[size_t(n)], s);
      }
  });
  return *std::max_element(row_max.begin(), row_max.end());
}

// Error bound of an fp32 dot product of K terms summed in some order: the GEMV's chains are
// ceil(K / (16 * 128)) * 16 sequential FMAs per thread, + 5 shuffles + 4 warp partials + the row
// scale; the GEMM (cuBLASLt, order unknown) gets the any-order bound of K additions. +2 for the
// reference's own fp32 rounding of the dequantized weights.
double fp32_dot_bound(int K, int epc, bool gemm) {
  const double chain = gemm ? K : double((K + epc * 128 - 1) / (epc * 128) * epc + 5 + 4 + 1);
  return (chain + 2) * kU;
}

Mat random_weight(std::mt19937& rng, int N, int K) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> lg(-3.f, 3.f);
  Mat w(N, K);
  for (int n = 0; n < N; ++n) {
    float s = 0.02f * std::exp2(lg(rng));  // rows of different magnitudes: per-row scales matter
    for (int k = 0; k < K; ++k) w.row(n)[k] = nd(rng) * s;
  }
  return w;
}

struct Fp8Dev {
  Fp8MatrixHost q;
  Mat deq;
  DevBuf<uint8_t> codes;
  DevBuf<float> scales;
  native::Fp8Weight view() const { return native::Fp8Weight{codes.p, scales.p, q.rows, q.cols, q.ld}; }
};
Fp8Dev upload_fp8(const Mat& w) {
  Fp8Dev d;
  d.q = quantize_fp8(w);
  d.deq = dequantize(d.q);
  d.codes = DevBuf<uint8_t>(d.q.codes.size());
  d.codes.upload(d.q.codes);
  d.scales = DevBuf<float>(d.q.scales.size());
  d.scales.upload(d.q.scales);
  return d;
}

// BF16 weight rows padded to 16 bytes (zeros), as the prepared store lays them out.
struct DenseDev {
  Mat deq;
  int64_t ld = 0;  // bytes
  DevBuf<uint8_t> data;
  DType dt = DType::BF16;
  native::DenseWeight view() const { return native::DenseWeight{data.p, dt, deq.rows, deq.cols, ld}; }
};
DenseDev upload_dense(const Mat& w, DType dt) {
  DenseDev d;
  d.dt = dt;
  const int64_t es = dt == DType::BF16 ? 2 : 4;
  d.ld = (w.cols * es + 15) / 16 * 16;
  std::vector<uint8_t> bytes(size_t(w.rows) * size_t(d.ld), 0);
  d.deq = Mat(w.rows, w.cols);
  for (int n = 0; n < w.rows; ++n)
    for (int k = 0; k < w.cols; ++k) {
      float v = w.row(n)[k];
      if (dt == DType::BF16) {
        uint16_t h = f32_to_bf16(v);
        std::memcpy(&bytes[size_t(n) * d.ld + 2 * k], &h, 2);
        d.deq.row(n)[k] = bf16_to_f32(h);
      } else {
        std::memcpy(&bytes[size_t(n) * d.ld + 4 * k], &v, 4);
        d.deq.row(n)[k] = v;
      }
    }
  d.data = DevBuf<uint8_t>(bytes.size());
  d.data.upload(bytes);
  return d;
}

// Runs y = W x on the GPU (FP8 or dense) for M tokens with x in `xt`; returns y [M][ld_y].
template <class Run>
std::vector<float> run_linear(const std::vector<float>& x, int M, int K, int64_t ldx, DType xt, int N, Run run) {
  DevBuf<uint8_t> xd(size_t(M) * size_t(ldx) * 4);
  if (xt == DType::BF16) {
    auto b = to_bf16(x);
    M3_CUDA_CHECK(cudaMemcpy(xd.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  } else {
    M3_CUDA_CHECK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  }
  const int64_t ldy = N + 3;  // a stride that is not the width
  DevBuf<float> y(size_t(M) * size_t(ldy));
  y.poison();
  run(native::ActIn{xd.p, xt, ldx}, y.p, ldy);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  (void)K;
  return y.download();
}

std::vector<float> ref_linear(const Mat& w, const std::vector<float>& x, int M, int64_t ldx) {
  std::vector<float> y(size_t(M) * size_t(w.rows));
  ref::linear(w, x.data(), ldx, M, y.data(), w.rows, pool());
  return y;
}

void check_fp8(const Mat& w, const std::vector<int>& Ms, const std::string& name) {
  const uint32_t seed = gpu_test_seed();
  SCOPED_TRACE(name + " seed " + std::to_string(seed));
  std::mt19937 rng(seed ^ uint32_t(w.rows * 7919 + w.cols));
  Fp8Dev d = upload_fp8(w);
  const int K = w.cols, N = w.rows;
  const int64_t ldx = (K + 7) / 8 * 8;
  int Mmax = *std::max_element(Ms.begin(), Ms.end());
  std::vector<float> xall = random_acts(rng, Mmax, K, ldx);
  for (int M : Ms) {
    std::vector<float> x(xall.begin(), xall.begin() + size_t(M) * ldx);
    auto ref = ref_linear(d.deq, x, M, ldx);
    const bool gemm = M > native::kGemvMaxM;
    const double atol = fp32_dot_bound(K, 16, gemm) * abs_dot_max(d.deq, x, M, ldx);
    for (DType xt : {DType::BF16, DType::F32}) {
      auto got = run_linear(x, M, K, ldx, xt, N, [&](native::ActIn a, float* y, int64_t ldy) {
        native::linear_fp8(d.view(), a, M, y, ldy, nullptr);
      });
      expect_close_rows(got, N + 3, ref, M, N, atol, 0,
                        name + " M=" + std::to_string(M) + (xt == DType::BF16 ? " x bf16" : " x f32") +
                            (gemm ? " (gemm)" : " (gemv)"));
    }
  }
}

}  // namespace

TEST(GpuGemv, Fp8FusedQkvRealShape) {
  std::mt19937 rng(gpu_test_seed());
  check_fp8(random_weight(rng, 9856, 6144), {1, 2, 3, 4, 7, 16, 64}, "qkv 9856x6144");
}

TEST(GpuGemv, Fp8TensorParallelAndOShapes) {
  std::mt19937 rng(gpu_test_seed() + 1);
  check_fp8(random_weight(rng, 2560, 6144), {1, 4}, "qkv tp4 2560x6144");
  check_fp8(random_weight(rng, 6144, 8192), {1, 4}, "o 6144x8192");
  check_fp8(random_weight(rng, 6144, 2048), {1, 16, 20}, "o tp4 6144x2048");
}

TEST(GpuGemv, Fp8OddShapes) {
  std::mt19937 rng(gpu_test_seed() + 2);
  check_fp8(random_weight(rng, 257, 333), {1, 2, 3, 4, 7, 16, 64}, "odd 257x333");
  check_fp8(random_weight(rng, 1, 17), {1, 5}, "odd 1x17");
  check_fp8(random_weight(rng, 33, 2049), {3, 9}, "odd 33x2049");
}

TEST(GpuGemv, DenseBf16AndF32) {
  const uint32_t seed = gpu_test_seed() + 3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int N, K;
    DType wt;
    std::vector<int> Ms;
    const char* name;
  };
  for (const C& c : {C{4099, 6144, DType::BF16, {1, 3, 16, 64}, "lm_head slice bf16"},
                     C{128, 6144, DType::F32, {1, 5, 40}, "router f32"},
                     C{128, 6144, DType::BF16, {1, 5}, "router bf16"},
                     C{257, 333, DType::BF16, {1, 7, 33}, "odd bf16"},
                     C{31, 333, DType::F32, {2, 17}, "odd f32"}}) {
    Mat w = random_weight(rng, c.N, c.K);
    DenseDev d = upload_dense(w, c.wt);
    const int64_t ldx = (c.K + 7) / 8 * 8;
    for (int M : c.Ms)
      for (DType xt : {DType::BF16, DType::F32}) {
        auto x = random_acts(rng, M, c.K, ldx);
        auto got = run_linear(x, M, c.K, ldx, xt, c.N, [&](native::ActIn a, float* y, int64_t ldy) {
          native::linear_dense(d.view(), a, M, y, ldy, nullptr);
        });
        auto ref = ref_linear(d.deq, x, M, ldx);
        const bool gemm = M > native::kGemvMaxM && c.wt == DType::BF16;
        const int epc = c.wt == DType::BF16 ? 8 : 4;
        double atol = fp32_dot_bound(c.K, epc, gemm) * abs_dot_max(d.deq, x, M, ldx);
        expect_close_rows(got, c.N + 3, ref, M, c.N, atol, 0,
                          std::string(c.name) + " M=" + std::to_string(M) + (xt == DType::BF16 ? " x bf16" : " x f32"));
      }
  }
}

TEST(GpuGemv, DenseMlpSwiglu) {
  const uint32_t seed = gpu_test_seed() + 4;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const float alpha = 1.702f, limit = 7.f;
  struct C {
    int H, I;
    std::vector<int> Ms;
  };
  for (const C& c : {C{6144, 3072, {1, 4, 33}}, C{333, 129, {2, 20}}}) {
    // gate/up scaled so that some activations reach the clamp at +-limit
    MlpWeights w;
    w.gate = random_weight(rng, c.I, c.H);
    w.up = random_weight(rng, c.I, c.H);
    w.down = random_weight(rng, c.H, c.I);
    Mat gu(2 * c.I, c.H);
    for (int j = 0; j < c.I; ++j) {
      std::memcpy(gu.row(2 * j), w.gate.row(j), size_t(c.H) * 4);
      std::memcpy(gu.row(2 * j + 1), w.up.row(j), size_t(c.H) * 4);
    }
    DenseDev dgu = upload_dense(gu, DType::BF16), ddn = upload_dense(w.down, DType::BF16);
    MlpWeights wd;  // the reference's weights: what the device holds
    wd.gate = Mat(c.I, c.H);
    wd.up = Mat(c.I, c.H);
    for (int j = 0; j < c.I; ++j) {
      std::memcpy(wd.gate.row(j), dgu.deq.row(2 * j), size_t(c.H) * 4);
      std::memcpy(wd.up.row(j), dgu.deq.row(2 * j + 1), size_t(c.H) * 4);
    }
    wd.down = ddn.deq;
    for (int M : c.Ms) {
      const int64_t ldx = (c.H + 7) / 8 * 8, ldh = (c.I + 3) / 4 * 4;
      auto x = random_acts(rng, M, c.H, ldx);
      DevBuf<float> h(size_t(M) * size_t(ldh));
      auto got = run_linear(x, M, c.H, ldx, DType::F32, c.H, [&](native::ActIn a, float* y, int64_t ldy) {
        native::dense_mlp(dgu.view(), ddn.view(), a, M, alpha, limit, h.p, ldh, y, ldy, nullptr);
      });
      std::vector<float> xc(size_t(M) * c.H), ref(size_t(M) * c.H);
      for (int t = 0; t < M; ++t) std::memcpy(&xc[size_t(t) * c.H], &x[size_t(t) * ldx], size_t(c.H) * 4);
      ref::mlp_forward(wd, xc.data(), M, alpha, limit, ref.data(), pool());
      // hidden activations: the reference's (double SwiGLU) values, to scale the down bound
      std::vector<float> g(size_t(M) * c.I), u(g.size());
      ref::linear(wd.gate, xc.data(), c.H, M, g.data(), c.I, pool());
      ref::linear(wd.up, xc.data(), c.H, M, u.data(), c.I, pool());
      for (size_t i = 0; i < g.size(); ++i) g[i] = ref::swiglu_oai(g[i], u[i], alpha, limit);
      const double s2 = abs_dot_max(wd.down, g, M, c.I);
      // GEMV: fp32 gate/up sums (relative error ~1e-6 of their term magnitudes) pass through
      // SwiGLU (slope below ~10 in the clamp range) into the down sum: 1e-4 of the down terms'
      // magnitude is two orders above that. GEMM: h is rounded to bf16 (2^-9 relative each)
      // before the down GEMM, so 2^-8 of the down terms' magnitude.
      const bool gemm = M > native::kGemvMaxM;
      const double atol = (gemm ? 0x1p-8 : 1e-4) * s2;
      expect_close_rows(got, c.H + 3, ref, M, c.H, atol, 0,
                        "dense mlp " + std::to_string(c.H) + "x" + std::to_string(c.I) + " M=" + std::to_string(M));
    }
  }
}

TEST(GpuGemv, RejectsBadArguments) {
  native::Fp8Weight w{reinterpret_cast<const uint8_t*>(16), reinterpret_cast<const float*>(16), 4, 20, 20};
  float* y = reinterpret_cast<float*>(256);
  native::ActIn x{reinterpret_cast<const void*>(256), DType::F32, 20};
  EXPECT_THROW(native::linear_fp8(w, x, 1, y, 4, nullptr), Error);  // ld 20 is not a multiple of 16
  w.ld = 32;
  x.ld = 18;
  EXPECT_THROW(native::linear_fp8(w, x, 1, y, 4, nullptr), Error);  // x rows not 16-byte aligned
  x.ld = 20;
  EXPECT_THROW(native::linear_fp8(w, x, 1, y, 3, nullptr), Error);  // output ld 3 < 4 rows
  x.dtype = DType::F16;
  EXPECT_THROW(native::linear_fp8(w, x, 1, y, 4, nullptr), Error);
}

// The CUDA-core GEMV (the router's path) gives a token the same bits whatever else is in the
// call: M tokens in one call (one block per 16 tokens once M > 16), the same tokens one at a time
// and in other groupings. The router's logits must not depend on the batch (serving's batch
// invariance), and prefill spreads its tokens over blocks.
TEST(GpuGemv, RowsDoNotDependOnM) {
  const uint32_t seed = gpu_test_seed() + 9;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int N, K;
    DType wt;
  };
  for (const C& c : {C{128, 6144, DType::F32}, C{31, 333, DType::F32}, C{257, 333, DType::BF16}}) {
    Mat w = random_weight(rng, c.N, c.K);
    DenseDev d = upload_dense(w, c.wt);
    const int64_t ldx = (c.K + 7) / 8 * 8;
    const int M = 300;
    auto x = random_acts(rng, M, c.K, ldx);
    for (DType xt : {DType::F32, DType::BF16}) {
      auto call = [&](int m0, int m) {  // tokens [m0, m0 + m) in one call
        std::vector<float> xs(x.begin() + int64_t(m0) * ldx, x.begin() + int64_t(m0 + m) * ldx);
        return run_linear(xs, m, c.K, ldx, xt, c.N, [&](native::ActIn a, float* y, int64_t ldy) {
          native::linear_dense(d.view(), a, m, y, ldy, nullptr, native::LinearPath::Gemv);
        });
      };
      const auto all = call(0, M);
      const int64_t ldy = c.N + 3;
      int compared = 0;
      // groupings: one token, a few tokens, one pass, just over a pass, an odd large group
      std::uniform_int_distribution<int> pick(0, M - 1);
      for (int m : {1, 1, 3, 16, 17, 45, 130}) {
        const int m0 = std::min(pick(rng), M - m);
        const auto part = call(m0, m);
        for (int t = 0; t < m; ++t)
          for (int n = 0; n < c.N; ++n) {
            const float a = all[size_t(m0 + t) * ldy + n], b = part[size_t(t) * ldy + n];
            ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << "token " << m0 + t << " row " << n;
            ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << c.N << "x" << c.K << " token " << m0 + t << " row " << n << " in a call of "
                                                 << m << ": " << a << " vs " << b << " (all " << M << " tokens)";
            ++compared;
          }
      }
      std::printf("GpuGemv invariance %dx%d %s x %s: %d values bitwise equal\n", c.N, c.K, std::string(dtype_name(c.wt)).c_str(),
                  xt == DType::F32 ? "f32" : "bf16", compared);
    }
  }
}

// Rows per work item (GemvParams::rows: one, or the default R) change only how the rows are spread
// over the GPU, never a row's sum: the same params with either R give the same bits (and both
// match the CPU reference). The router (128 rows) runs one row per item on an H200.
TEST(GpuGemv, RowsPerItemDoNotChangeTheBits) {
  const uint32_t seed = gpu_test_seed() + 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int N, K;
    DType wt;
  };
  int compared = 0;
  for (const C& c : {C{128, 6144, DType::F32}, C{37, 1000, DType::F32}, C{128, 6144, DType::BF16}})
    for (int M : {1, 2, 3, 4, 17, 40}) {  // up to 4 tokens: R = 1; 17 and 40 (16 a pass): the prefill R
      Mat w = random_weight(rng, c.N, c.K);
      DenseDev d = upload_dense(w, c.wt);
      const int64_t ldx = (c.K + 7) / 8 * 8;
      auto x = random_acts(rng, M, c.K, ldx);
      std::vector<float> out[2];
      for (int one = 0; one < 2; ++one)
        out[one] = run_linear(x, M, c.K, ldx, DType::F32, c.N, [&](native::ActIn a, float* y, int64_t ldy) {
          auto p = native::make_gemv_params(d.data.p, c.wt, nullptr, d.ld, c.N, c.K, a, M, y, ldy, false, 0.f, 0.f);
          p.rows = !one ? kernels::gemv_rows_per_item(p.mt) : M <= 4 ? 1 : kernels::kGemvPrefillRows;
          native::launch(p, nullptr);
        });
      const int64_t ldy = c.N + 3;
      for (int t = 0; t < M; ++t)
        for (int n = 0; n < c.N; ++n) {
          const float a = out[0][size_t(t) * ldy + n], b = out[1][size_t(t) * ldy + n];
          ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << "token " << t << " row " << n << " not written (poison)";
          ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << c.N << "x" << c.K << " M " << M << " token " << t << " row " << n
                                               << ": R=default " << a << ", R=" << (M <= 4 ? 1 : kernels::kGemvPrefillRows)
                                               << " " << b;
          ++compared;
        }
      // and right: the fp32 dot-product bound of the other GEMV tests against the CPU reference
      const double atol = fp32_dot_bound(c.K, c.wt == DType::BF16 ? 8 : 4, false) * abs_dot_max(d.deq, x, M, ldx);
      expect_close_rows(out[1], ldy, ref_linear(d.deq, x, M, ldx), M, c.N, atol, 0,
                        std::to_string(c.N) + "x" + std::to_string(c.K) + " R=1 or prefill R, M=" + std::to_string(M));
    }
  std::printf("GpuGemv rows per item: %d values bitwise equal between R = 1 (M <= 4) or %d (M > 16) and the default\n",
              compared, kernels::kGemvPrefillRows);
}
