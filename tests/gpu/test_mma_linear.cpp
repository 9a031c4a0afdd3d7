// The tensor-core linear kernel (kernels/mma_linear.cuh through native/linear.h):
//  - the E4M3 -> bf16 decode against the host codec for all 254 finite codes in every byte position;
//  - accuracy against a double CPU product on fresh random inputs: the real per-rank shapes of
//    MiniMax-M3 at TP 1 and 4 (fused q|k|v|iq|ik 9856 / 2560 x 6144, O 6144 x 8192 / 2048, dense
//    MLP gate/up 2 x 3072 x 6144 with the SwiGLU epilogue and down 6144 x 3072 at TP 4, an lm_head
//    slice) and odd shapes (K not a multiple of 64, N not a multiple of 16, M = 1..9, 17, 33, 300),
//    FP8 and BF16 weights, fp32 and bf16 activations; every element checked against its own bound,
//    the worst printed;
//  - activations split by their producer (ActFmt::F32Split) give the decode tile's fp32 bits;
//  - batch invariance: every row of any subset / order / size of a 300-token batch, under every
//    tiling, is bitwise the row of the full run (memcmp), FP8 and BF16, plain and SwiGLU; the same
//    for the router's GEMV (F32 and BF16 router weights);
//  - with M3_BENCH=1, a sweep of tilings vs the CUDA-core GEMV and a plain cold read, and the
//    prefill rate at M = 2048.
// Outputs are poisoned with NaN before every run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/codecs.h"
#include "core/parallel.h"
#include "core/weight_tiles.h"
#include "native/linear.h"
#include "native/weight_tiles.h"
#include "act_split_host.h"
#include "norm_halves_host.h"
#include "test_gemv_util.h"
#include "test_mma_linear_dev.h"

using namespace m3;
using namespace m3::test;

namespace {

// A weight on the device as the prepared store lays it out (rows of ld bytes, zero past K), and the
// values the device multiplies: FP8 code values (the row scale is applied to the sum) or BF16 values.
struct DevWeight {
  DType dt = DType::F8_E4M3;
  int N = 0, K = 0;
  int64_t ld = 0;  // bytes
  std::vector<float> val;    // [N][K]
  std::vector<float> scale;  // [N] (1 for BF16)
  DevBuf<uint8_t> data;
  DevBuf<float> scales;
  const float* scale_ptr() const { return dt == DType::F8_E4M3 ? scales.p : nullptr; }
};

// FP8: codes of N(0, 64^2) values (saturated to 448, small ones subnormal), row scales 2^U(-12, -4);
// BF16: N(0, 1) * 2^U(-6, 0) per row, rounded to bf16.
DevWeight random_weight(std::mt19937& rng, DType dt, int N, int K) {
  DevWeight w;
  w.dt = dt;
  w.N = N;
  w.K = K;
  const int64_t es = dt == DType::F8_E4M3 ? 1 : 2;
  w.ld = (int64_t(K) * es + 15) / 16 * 16;
  w.val.assign(size_t(N) * size_t(K), 0.f);
  w.scale.assign(size_t(N), 1.f);
  std::vector<uint8_t> bytes(size_t(N) * size_t(w.ld), 0);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ex(dt == DType::F8_E4M3 ? -12.f : -6.f, dt == DType::F8_E4M3 ? -4.f : 0.f);
  for (int n = 0; n < N; ++n) {
    const float rs = std::exp2(ex(rng));
    uint8_t* row = bytes.data() + size_t(n) * size_t(w.ld);
    if (dt == DType::F8_E4M3) {
      w.scale[size_t(n)] = rs;
      for (int k = 0; k < K; ++k) {
        const uint8_t c = f32_to_e4m3(nd(rng) * 64.f);
        row[k] = c;
        w.val[size_t(n) * K + k] = e4m3_to_f32(c);
      }
    } else {
      for (int k = 0; k < K; ++k) {
        const uint16_t h = f32_to_bf16(nd(rng) * rs);
        std::memcpy(row + 2 * k, &h, 2);
        w.val[size_t(n) * K + k] = bf16_to_f32(h);
      }
    }
  }
  w.data = DevBuf<uint8_t>(bytes.size());
  w.data.upload(bytes);
  if (dt == DType::F8_E4M3) {
    w.scales = DevBuf<float>(size_t(N));
    w.scales.upload(w.scale);
  }
  return w;
}

// fp32 activations N(0, s^2) with s = 2^U(-3, 3) per token (not bf16-exact: the lo half matters),
// rows of ld elements, garbage (NaN) past K so the kernel must mask it.
std::vector<float> random_x(std::mt19937& rng, int M, int K, int64_t ld) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ex(-3.f, 3.f);
  std::vector<float> x(size_t(M) * size_t(ld), std::nanf(""));
  for (int t = 0; t < M; ++t) {
    const float s = std::exp2(ex(rng));
    for (int k = 0; k < K; ++k) x[size_t(t) * ld + k] = nd(rng) * s;
  }
  return x;
}

int64_t act_ld(int K) { return (K + 7) / 8 * 8 + 8; }  // 16-byte rows in both formats, padded

// Device copy of x in fp32 or bf16 (bf16: x rounded; the NaN padding stays NaN).
struct DevAct {
  DevBuf<uint8_t> buf;
  native::ActIn in;
};
DevAct upload_act(const std::vector<float>& x, int64_t ld, DType xt) {
  DevAct a;
  if (xt == DType::BF16) {
    auto b = to_bf16(x);
    a.buf = DevBuf<uint8_t>(b.size() * 2);
    M3_CUDA_CHECK(cudaMemcpy(a.buf.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  } else {
    a.buf = DevBuf<uint8_t>(x.size() * 4);
    M3_CUDA_CHECK(cudaMemcpy(a.buf.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  }
  a.in = native::ActIn{a.buf.p, xt, ld};
  return a;
}

// Double reference: sum[t][n] = scale_n * sum_k val[n,k] x[t,k], mag[t][n] = |scale_n| sum_k |.|.
struct Ref {
  std::vector<double> sum, mag;  // [M][N]
};
Ref reference(const DevWeight& w, const std::vector<float>& x, int M, int64_t ld, bool bf16_x) {
  Ref r;
  r.sum.assign(size_t(M) * w.N, 0.0);
  r.mag.assign(size_t(M) * w.N, 0.0);
  std::vector<double> xd(size_t(M) * w.K);
  for (int t = 0; t < M; ++t)
    for (int k = 0; k < w.K; ++k) {
      const float v = x[size_t(t) * ld + k];
      xd[size_t(t) * w.K + k] = bf16_x ? bf16_round(v) : v;
    }
  pool().parallel_for(w.N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* wr = w.val.data() + size_t(n) * w.K;
      for (int t = 0; t < M; ++t) {
        const double* xr = xd.data() + size_t(t) * w.K;
        double s = 0, a = 0;
        for (int k = 0; k < w.K; ++k) {
          const double p = double(wr[k]) * xr[k];
          s += p;
          a += std::fabs(p);
        }
        r.sum[size_t(t) * w.N + n] = s * w.scale[size_t(n)];
        r.mag[size_t(t) * w.N + n] = a * w.scale[size_t(n)];
      }
    }
  });
  return r;
}

// The bound of one output over sum_k |w x| (the header of kernels/mma_linear.cuh gives the order):
//  - x = hi + lo misses x by at most 2^-18 |x| (fp32 x only);
//  - one MMA adds 16 exact products to its accumulator; assuming (as measured for earlier tensor
//    cores) that each addend is aligned to the largest and truncated, it errs by < 17 ulps of
//    that largest magnitude <= 34 u of the block's sum of |terms|, for the 8 MMAs of a block;
//  - the chain adds ceil(B / P) block sums, the total P chain sums, then the row scale: u each.
double coef(const DevWeight& w, bool fp32_x) {
  const int blocks = (w.K + 63) / 64, P = native::mma_chains(w.N, w.K);
  const int chain = (blocks + P - 1) / P;
  return (fp32_x ? 0x1p-18 : 0.0) + (8 * 34 + chain + P + 1) * kU;
}

struct Worst {
  double ratio = 0;
  std::string where;
};

// Every output of got [M][ld_y] against ref within coef * mag; NaN (unwritten) fails.
void check_plain(const std::vector<float>& got, int64_t ld_y, const Ref& ref, int M, int N, double c,
                 const std::string& what) {
  Worst worst;
  int bad = 0;
  for (int t = 0; t < M; ++t)
    for (int n = 0; n < N; ++n) {
      const double g = got[size_t(t) * ld_y + n], r = ref.sum[size_t(t) * N + n];
      const double bound = c * ref.mag[size_t(t) * N + n];
      const double err = std::fabs(g - r);
      const double ratio = bound > 0 ? err / bound : (err == 0 ? 0 : INFINITY);
      if (!(ratio <= 1)) ++bad;
      if (!(ratio <= worst.ratio)) {
        worst.ratio = std::isnan(ratio) ? INFINITY : ratio;
        worst.where = fmt::format("t {} n {}: got {:.9g} ref {:.9g} |d| {:.3g} bound {:.3g}", t, n, g, r, err, bound);
      }
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of bound; worst " << worst.where;
  std::printf("  %-52s worst |d|/bound %.3g (%s)\n", what.c_str(), worst.ratio, worst.where.c_str());
}

double swiglu_d(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

// SwiGLU outputs [M][N/2] against the double SwiGLU of the reference gate/up: the gate and up
// bounds carried through the function's slopes (at the reference point, doubled for the curvature
// over so small a step), plus the fp32 evaluation (expf, a division, three products: 16 u of
// |(u + 1) g|).
void check_swiglu(const std::vector<float>& got, int64_t ld_y, const Ref& ref, int M, int N, double c, float alpha,
                  float limit, const std::string& what) {
  Worst worst;
  int bad = 0;
  for (int t = 0; t < M; ++t)
    for (int j = 0; j < N / 2; ++j) {
      const size_t ig = size_t(t) * N + 2 * j, iu = ig + 1;
      const double gr = ref.sum[ig], ur = ref.sum[iu];
      const double r = swiglu_d(gr, ur, alpha, limit);
      const double g = std::min(gr, double(limit)), u = std::clamp(ur, -double(limit), double(limit));
      const double sig = 1 / (1 + std::exp(-alpha * g));
      const double dg = std::fabs((u + 1) * (sig + alpha * g * sig * (1 - sig)));
      const double du = std::fabs(g * sig);
      const double bound = 2 * (dg * c * ref.mag[ig] + du * c * ref.mag[iu]) + 16 * kU * std::fabs((u + 1) * g) + 1e-30;
      const double v = got[size_t(t) * ld_y + j], err = std::fabs(v - r), ratio = err / bound;
      if (!(ratio <= 1)) ++bad;
      if (!(ratio <= worst.ratio)) {
        worst.ratio = std::isnan(ratio) ? INFINITY : ratio;
        worst.where = fmt::format("t {} j {}: got {:.9g} ref {:.9g} |d| {:.3g} bound {:.3g}", t, j, v, r, err, bound);
      }
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of bound; worst " << worst.where;
  std::printf("  %-52s worst |d|/bound %.3g (%s)\n", what.c_str(), worst.ratio, worst.where.c_str());
}

// y = W x through the public launcher (poisoned output of M rows of ld_y).
std::vector<float> run_mma(const DevWeight& w, const native::ActIn& x, int M, int64_t ld_y, bool swiglu,
                           native::MmaTiling tiling = {}, float alpha = 1.702f, float limit = 7.f) {
  DevBuf<float> y(size_t(M) * size_t(ld_y));
  y.poison();
  native::mma_linear(w.data.p, w.dt, w.scale_ptr(), w.ld, w.N, w.K, x, M, y.p, ld_y, swiglu, alpha, limit, nullptr,
                     tiling);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  return y.download();
}

// Accuracy of one weight over the token counts Ms (the first M tokens of one activation set).
void check_accuracy(std::mt19937& rng, const DevWeight& w, const std::vector<int>& Ms, bool swiglu,
                    const std::vector<DType>& xts, const std::string& name) {
  const int Mmax = *std::max_element(Ms.begin(), Ms.end());
  const int64_t ld = act_ld(w.K);
  const auto x = random_x(rng, Mmax, w.K, ld);
  const float alpha = 1.702f, limit = 7.f;
  for (DType xt : xts) {
    const bool fp32 = xt == DType::F32;
    const Ref ref = reference(w, x, Mmax, ld, !fp32);
    const DevAct a = upload_act(x, ld, xt);
    const double c = coef(w, fp32);
    for (int M : Ms) {
      const int64_t ld_y = (swiglu ? w.N / 2 : w.N) + 3;  // a stride that is not the width
      const auto got = run_mma(w, a.in, M, ld_y, swiglu, {}, alpha, limit);
      const auto t = native::mma_tiling_for(w.N, w.K, M);
      const std::string what = fmt::format("{} M={} x {}{} ({} {}x{})", name, M, fp32 ? "f32" : "bf16",
                                           swiglu ? " swiglu" : "", t.deep ? "deep" : "wide", t.rt, t.nt);
      if (swiglu) check_swiglu(got, ld_y, ref, M, w.N, c, alpha, limit, what);
      else check_plain(got, ld_y, ref, M, w.N, c, what);
    }
  }
}

const std::vector<native::MmaTiling>& all_tilings() {
  // the decode tile twice: the register walk first (the reference of the tests below), then
  // streamed (FP8 weights; BF16 weights take the register walk either way)
  static const std::vector<native::MmaTiling> t{{1, 1, false, 0}, {1, 1, false, 1}, {1, 2, false},
                                                {2, 1, false},    {2, 2, false},    {4, 1, false},
                                                {4, 4, true}};
  return t;
}

}  // namespace

TEST(GpuMmaLinear, DecodeAllE4m3Codes) {
  // every finite code (0x7f / 0xff are NaN: the quantizer never writes them) in every byte
  // position, each word a random mix
  const uint32_t seed = gpu_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(uint8_t(c));
  std::vector<uint32_t> words;
  for (int pos = 0; pos < 4; ++pos)
    for (uint8_t c : codes) {
      uint8_t b[4];
      for (auto& v : b) v = codes[rng() % codes.size()];
      b[pos] = c;
      uint32_t w;
      std::memcpy(&w, b, 4);
      words.push_back(w);
    }
  DevBuf<uint32_t> dw(words.size()), out(2 * words.size());
  dw.upload(words);
  out.poison();
  mma_decode_e4m3_words(dw.p, int(words.size()), out.p);
  const auto got = out.download();
  int bad = 0;
  for (size_t i = 0; i < words.size(); ++i)
    for (int e = 0; e < 4; ++e) {
      const uint8_t c = uint8_t(words[i] >> (8 * e));
      const uint16_t want = uint16_t(f32_to_bits(e4m3_to_f32(c)) >> 16);  // exact: E4M3 values are bf16 values
      EXPECT_EQ(f32_to_bits(e4m3_to_f32(c)) & 0xffffu, 0u) << "code " << int(c) << " is not a bf16 value";
      const uint16_t have = uint16_t(got[2 * i + e / 2] >> (16 * (e % 2)));
      if (have != want && ++bad <= 8)
        ADD_FAILURE() << fmt::format("code 0x{:02x} (byte {} of 0x{:08x}): bf16 0x{:04x}, want 0x{:04x}", c, e,
                                     words[i], have, want);
    }
  EXPECT_EQ(bad, 0);
}

TEST(GpuMmaLinear, RealShapesMatchDoubleReference) {
  const uint32_t seed = gpu_test_seed() + 10;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<int> Ms{1, 2, 3, 4, 5, 8, 9, 17, 33};
  const std::vector<DType> both{DType::F32, DType::BF16}, f32{DType::F32};
  check_accuracy(rng, random_weight(rng, DType::F8_E4M3, 2560, 6144), {1, 2, 3, 4, 5, 8, 9, 17, 33, 300}, false, both,
                 "qkv tp4 2560x6144 fp8");
  check_accuracy(rng, random_weight(rng, DType::F8_E4M3, 9856, 6144), Ms, false, f32, "qkv tp1 9856x6144 fp8");
  check_accuracy(rng, random_weight(rng, DType::F8_E4M3, 6144, 8192), {1, 4, 9, 33}, false, f32, "o tp1 6144x8192 fp8");
  check_accuracy(rng, random_weight(rng, DType::F8_E4M3, 6144, 2048), Ms, false, f32, "o tp4 6144x2048 fp8");
  check_accuracy(rng, random_weight(rng, DType::BF16, 6144, 6144), {1, 3, 8, 17, 300}, true, both,
                 "mlp gate|up tp4 6144x6144 bf16");
  check_accuracy(rng, random_weight(rng, DType::BF16, 6144, 3072), {1, 3, 8, 17, 33}, false, f32,
                 "mlp down tp4 6144x3072 bf16");
  check_accuracy(rng, random_weight(rng, DType::BF16, 4099, 6144), {1, 4, 33}, false, f32, "lm_head slice 4099x6144 bf16");
}

TEST(GpuMmaLinear, OddShapesMatchDoubleReference) {
  const uint32_t seed = gpu_test_seed() + 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<int> Ms{1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 300};
  struct S {
    int N, K;
  };
  for (DType dt : {DType::F8_E4M3, DType::BF16})
    for (S s : {S{1, 17}, S{17, 65}, S{33, 2049}, S{257, 333}, S{1000, 1000}, S{130, 64}, S{2, 7}})
      for (bool sw : {false, true}) {
        if (sw && s.N % 2) continue;
        check_accuracy(rng, random_weight(rng, dt, s.N, s.K), Ms, sw, {DType::F32, DType::BF16},
                       fmt::format("odd {}x{} {}", s.N, s.K, dt == DType::BF16 ? "bf16" : "fp8"));
      }
}

namespace {

// Runs `run(x, M, y, ld_y)` on the full batch and on random subsets (random order, repeats allowed)
// of the sizes below, and requires every row to be bitwise the full run's row.
void check_invariance(std::mt19937& rng, int K, int width, int64_t ldx, DType xt, const std::vector<float>& x,
                      int Mfull, const std::function<void(const native::ActIn&, int, float*, int64_t)>& run,
                      const std::string& name) {
  const int64_t ld_y = width + 5;
  auto launch = [&](const std::vector<int>& rows) {
    std::vector<float> xs(rows.size() * size_t(ldx));
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(&xs[i * ldx], &x[size_t(rows[i]) * ldx], size_t(ldx) * 4);
    DevAct a = upload_act(xs, ldx, xt);
    DevBuf<float> y(rows.size() * size_t(ld_y));
    y.poison();
    run(a.in, int(rows.size()), y.p, ld_y);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    return y.download();
  };
  std::vector<int> all(static_cast<size_t>(Mfull));
  std::iota(all.begin(), all.end(), 0);
  const auto full = launch(all);
  for (int t = 0; t < Mfull; ++t)
    for (int j = 0; j < width; ++j) ASSERT_TRUE(std::isfinite(full[size_t(t) * ld_y + j])) << name << " t " << t;
  int checked = 0, bad = 0;
  for (int size : {1, 2, 3, 4, 7, 8, 9, 16, 17, 64, 129})
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<int> rows(static_cast<size_t>(size));
      if (rep == 0) {  // distinct rows in random order
        std::vector<int> perm = all;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::copy(perm.begin(), perm.begin() + size, rows.begin());
      } else {
        for (int& r : rows) r = int(rng() % uint32_t(Mfull));
      }
      const auto got = launch(rows);
      for (int i = 0; i < size; ++i) {
        ++checked;
        if (std::memcmp(&got[size_t(i) * ld_y], &full[size_t(rows[size_t(i)]) * ld_y], size_t(width) * 4) != 0 &&
            ++bad <= 5)
          ADD_FAILURE() << name << ": row " << rows[size_t(i)] << " at position " << i << " of " << size
                        << " differs from the full batch";
      }
    }
  EXPECT_EQ(bad, 0) << name;
  std::printf("  %-52s %d rows bitwise equal to the %d-token batch\n", name.c_str(), checked - bad, Mfull);
  (void)K;
}

}  // namespace

TEST(GpuMmaLinear, RowsBitwiseIndependentOfBatch) {
  const uint32_t seed = gpu_test_seed() + 12;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int Mfull = 300;
  struct C {
    DType dt;
    int N, K;
    bool swiglu;
    const char* name;
  };
  for (const C& c : {C{DType::F8_E4M3, 2560, 6144, false, "fp8 qkv tp4 2560x6144"},
                     C{DType::F8_E4M3, 1000, 333, true, "fp8 1000x333 swiglu"},
                     C{DType::BF16, 4099, 1000, false, "bf16 4099x1000"},
                     C{DType::BF16, 6144, 3072, true, "bf16 gate|up 6144x3072 swiglu"}}) {
    const DevWeight w = random_weight(rng, c.dt, c.N, c.K);
    const int64_t ldx = act_ld(c.K);
    const auto x = random_x(rng, Mfull, c.K, ldx);
    const int width = c.swiglu ? c.N / 2 : c.N;
    for (DType xt : {DType::F32, DType::BF16}) {
      const std::string xs = xt == DType::F32 ? " x f32" : " x bf16";
      check_invariance(rng, c.K, width, ldx, xt, x, Mfull,
                       [&](const native::ActIn& a, int M, float* y, int64_t ld_y) {
                         native::mma_linear(w.data.p, w.dt, w.scale_ptr(), w.ld, w.N, w.K, a, M, y, ld_y, c.swiglu,
                                            1.702f, 7.f, nullptr);
                       },
                       c.name + xs + " (tiling by M)");
      for (const auto& t : all_tilings())
        check_invariance(rng, c.K, width, ldx, xt, x, Mfull,
                         [&](const native::ActIn& a, int M, float* y, int64_t ld_y) {
                           native::mma_linear(w.data.p, w.dt, w.scale_ptr(), w.ld, w.N, w.K, a, M, y, ld_y,
                                              c.swiglu, 1.702f, 7.f, nullptr, t);
                         },
                         fmt::format("{}{} ({} {}x{}{})", c.name, xs, t.deep ? "deep" : "wide", t.rt, t.nt,
                                     t.stream == 1 ? " streamed" : ""));
    }
    // every tiling gives the same rows for the full batch
    const DevAct a = upload_act(x, ldx, DType::F32);
    const auto ref = run_mma(w, a.in, Mfull, width + 1, c.swiglu, all_tilings()[0]);
    for (const auto& t : all_tilings()) {
      const auto got = run_mma(w, a.in, Mfull, width + 1, c.swiglu, t);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * 4), 0)
          << c.name << ": tiling " << (t.deep ? "deep " : "wide ") << t.rt << "x" << t.nt
          << (t.stream == 1 ? " streamed" : "") << " differs from 1x1";
    }
  }
}

TEST(GpuMmaLinear, TiledLayoutGivesTheSameBits) {
  // The prepared arena's tiled FP8 layout (core/weight_tiles.h) holds the same codes at other
  // addresses: every tiling (register walk, streamed decode tile, wide, deep) and both activation
  // formats must give bitwise the row-major result. The device tiling (native::tile_fp8) is checked
  // byte for byte against the host's (tile_rows_to) on the way, padding rows included.
  const uint32_t seed = gpu_test_seed() + 15;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct S {
    int N, K;
  };
  int compared = 0;
  for (S s : {S{1, 17}, S{17, 65}, S{33, 2049}, S{257, 333}, S{1000, 1000}, S{2560, 6144}, S{130, 64}}) {
    const DevWeight w = random_weight(rng, DType::F8_E4M3, s.N, s.K);
    // the same codes row-major at ld = round_up(K, 64), and tiled from them on the device
    const int64_t ld = (s.K + kTileBlockBytes - 1) / kTileBlockBytes * kTileBlockBytes;
    const std::vector<uint8_t> packed = w.data.download();
    std::vector<uint8_t> rows(size_t(s.N) * size_t(ld), 0);
    for (int n = 0; n < s.N; ++n) std::memcpy(&rows[size_t(n) * ld], &packed[size_t(n) * w.ld], size_t(w.ld));
    DevBuf<uint8_t> rd(rows.size()), td(size_t(tiled_rows(s.N)) * size_t(ld));
    rd.upload(rows);
    M3_CUDA_CHECK(cudaMemset(td.p, 0xa5, td.n));  // poison: every byte must be written
    native::tile_fp8(rd.p, s.N, ld, td.p, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> host_tiled(td.n);
    tile_rows_to(rows.data(), s.N, ld, host_tiled.data());
    ASSERT_EQ(td.download(), host_tiled) << s.N << "x" << s.K << ": device tiling differs from the host's";
    const native::Fp8Weight row_major{rd.p, w.scales.p, s.N, s.K, ld, false}, tiled{td.p, w.scales.p, s.N, s.K, ld, true};
    const int64_t ldx = act_ld(s.K);
    const auto x = random_x(rng, 300, s.K, ldx);
    for (DType xt : {DType::F32, DType::BF16}) {
      const DevAct a = upload_act(x, ldx, xt);
      for (int M : {1, 3, 8, 9, 17, 300})
        for (const auto& t : all_tilings()) {
          auto run = [&](const native::Fp8Weight& fw) {
            const int64_t ld_y = s.N + 3;
            DevBuf<float> y(size_t(M) * size_t(ld_y));
            y.poison();
            native::launch(native::make_fp8_linear_params(fw, a.in, M, y.p, ld_y, t), nullptr);
            M3_CUDA_CHECK(cudaDeviceSynchronize());
            auto v = y.download();
            for (int tk = 0; tk < M; ++tk)
              for (int n = 0; n < s.N; ++n) EXPECT_TRUE(std::isfinite(v[size_t(tk) * ld_y + n])) << tk << " " << n;
            return v;
          };
          const auto want = run(row_major), got = run(tiled);
          ++compared;
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << s.N << "x" << s.K << " M=" << M << (xt == DType::F32 ? " x f32 " : " x bf16 ")
              << (t.deep ? "deep " : "wide ") << t.rt << "x" << t.nt << (t.stream == 1 ? " streamed" : "")
              << ": tiled differs from row-major";
        }
    }
  }
  std::printf("  %d (shape, M, x format, tiling) runs: tiled == row-major bitwise\n", compared);
  // refusals: a tiled weight whose rows are not whole 64-byte blocks, and the GEMV on tiled weights
  const DevWeight w = random_weight(rng, DType::F8_E4M3, 16, 48);
  DevBuf<float> y(64);
  const DevAct a = upload_act(random_x(rng, 1, 48, act_ld(48)), act_ld(48), DType::F32);
  EXPECT_THROW(native::make_fp8_linear_params(native::Fp8Weight{w.data.p, w.scales.p, 16, 48, 48, true}, a.in, 1, y.p, 16),
               Error);
  EXPECT_THROW(native::linear_fp8(native::Fp8Weight{w.data.p, w.scales.p, 16, 48, 64, true}, a.in, 1, y.p, 16, nullptr,
                                  native::LinearPath::Gemv),
               Error);
}

TEST(GpuMmaLinear, SplitActivationsGiveTheSameBits) {
  // The FP8 decode tile over activations its producer split (ActFmt::F32Split through
  // native::use_split_activations) gives bitwise what it gives over the fp32 rows: every M it
  // serves (1 .. kMmaDecodeRows), whole items and partial ones (N not a multiple of 16, K not a
  // multiple of 64 or of 4), each instantiation by norm mode (plain; the consumer half, nin.inv;
  // the producer half, nout: residual, z and chunk sums compared). Outputs poisoned first.
  const uint32_t seed = gpu_test_seed() + 43;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  struct S {
    int N, K;
  };
  int compared = 0;
  for (S s : {S{1, 17}, S{17, 65}, S{33, 2049}, S{257, 333}, S{130, 64}, S{2560, 6144}, S{6144, 2048}}) {
    const DevWeight w = random_weight(rng, DType::F8_E4M3, s.N, s.K);
    const int64_t ldx = act_ld(s.K);
    const auto x = random_x(rng, native::kMmaDecodeRows, s.K, ldx);
    const DevAct a = upload_act(x, ldx, DType::F32);
    const auto xs_host = split_rows_host(x, native::kMmaDecodeRows, s.K, ldx);
    DevBuf<uint16_t> xs(xs_host.size());
    M3_CUDA_CHECK(cudaMemcpy(xs.p, xs_host.data(), xs_host.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> nw(size_t(s.N));
    for (auto& v : nw) v = f32_to_bf16(nd(rng) * 0.2f);
    DevBuf<uint16_t> dnw(nw.size());
    M3_CUDA_CHECK(cudaMemcpy(dnw.p, nw.data(), nw.size() * 2, cudaMemcpyHostToDevice));
    for (int M = 1; M <= native::kMmaDecodeRows; ++M) {
      std::vector<float> inv(static_cast<size_t>(M));
      for (auto& v : inv) v = std::exp2(nd(rng));
      DevBuf<float> dinv(inv.size());
      dinv.upload(inv);
      std::vector<float> res0(size_t(M) * s.N);
      for (auto& v : res0) v = nd(rng) * 4.f;
      for (int mode = 0; mode < 3; ++mode) {  // plain, consumer (nin), producer (nout)
        if (mode == 2 && s.N % 16 != 0) continue;
        // outputs of one run: y, or (producer) the residual, z and chunk sums
        auto run = [&](bool split) {
          DevBuf<float> y(size_t(M) * s.N), res(res0.size()), z(res0.size()), ss(size_t(M) * (s.N / 16 + 1));
          y.poison();
          z.poison();
          ss.poison();
          res.upload(res0);
          kernels::MmaLinearParams p = native::make_fp8_linear_params(
              native::Fp8Weight{w.data.p, w.scales.p, s.N, s.K, w.ld}, a.in, M, y.p, s.N, native::MmaTiling{1, 1, false, 0});
          if (mode == 1) p.nin = kernels::NormIn{nullptr, dinv.p, s.K, M, 1e-6f};
          if (mode == 2) p.nout = kernels::NormOut{res.p, dnw.p, z.p, ss.p, nullptr, s.N, s.N};
          EXPECT_EQ(native::use_split_activations(p, split ? xs.p : nullptr), split);
          native::launch(p, nullptr);
          M3_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<float> out = mode == 2 ? res.download() : y.download();
          if (mode == 2) {
            const auto zz = z.download(), sv = ss.download();
            out.insert(out.end(), zz.begin(), zz.end());
            out.insert(out.end(), sv.begin(), sv.begin() + size_t(M) * (s.N / 16));
          }
          return out;
        };
        const auto want = run(false), got = run(true);
        ++compared;
        size_t bad = 0, first = got.size();
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(std::isfinite(want[i])) << "element " << i;
          if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) first = i;
        }
        EXPECT_EQ(bad, 0u) << s.N << "x" << s.K << " M=" << M << " mode " << mode << ": " << bad
                           << " values differ, the first at " << first << " (split "
                           << (first < got.size() ? got[first] : 0.f) << ", fp32 "
                           << (first < got.size() ? want[first] : 0.f) << ")";
      }
    }
  }
  std::printf("  %d (shape, M, norm mode) runs: split activations == fp32 bitwise\n", compared);
  // which tiles take split activations: the decode tile's register walk only; none when switched off
  const DevWeight w = random_weight(rng, DType::F8_E4M3, 64, 128);
  const DevAct a = upload_act(random_x(rng, 16, 128, act_ld(128)), act_ld(128), DType::F32);
  DevBuf<uint16_t> xs(size_t(16) * 2 * act_ld(128));
  DevBuf<float> y(16 * 64);
  const native::Fp8Weight fw{w.data.p, w.scales.p, 64, 128, w.ld};
  auto takes = [&](int M, native::MmaTiling t) {
    kernels::MmaLinearParams p = native::make_fp8_linear_params(fw, a.in, M, y.p, 64, t);
    return native::use_split_activations(p, xs.p);
  };
  EXPECT_TRUE(takes(1, {}));
  EXPECT_TRUE(takes(native::kMmaDecodeRows, {}));
  EXPECT_FALSE(takes(native::kMmaDecodeRows + 1, {}));  // the 2 x 2 tile
  EXPECT_FALSE(takes(4, native::MmaTiling{1, 1, false, 1}));  // streamed
  EXPECT_FALSE(takes(4, native::MmaTiling{4, 4, true}));  // deep
  native::set_split_activations(0);
  EXPECT_FALSE(takes(1, {}));
  native::set_split_activations(-1);
}

TEST(GpuMmaLinear, LinearEntryPointsAreBatchInvariant) {
  // linear_fp8 / linear_dense / dense_mlp as the backend calls them, and the router's GEMV
  // (F32 and BF16 router weights, LinearPath::Gemv as moe.cu calls it)
  const uint32_t seed = gpu_test_seed() + 13;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int Mfull = 300, H = 1024, I = 640;
  const int64_t ldx = act_ld(H);
  const auto x = random_x(rng, Mfull, H, ldx);
  const DevWeight q = random_weight(rng, DType::F8_E4M3, 700, H);
  check_invariance(rng, H, q.N, ldx, DType::F32, x, Mfull,
                   [&](const native::ActIn& a, int M, float* y, int64_t ld_y) {
                     native::linear_fp8(native::Fp8Weight{q.data.p, q.scales.p, q.N, q.K, q.ld}, a, M, y, ld_y,
                                        nullptr);
                   },
                   "linear_fp8 700x1024");
  const DevWeight gu = random_weight(rng, DType::BF16, 2 * I, H), dn = random_weight(rng, DType::BF16, H, I);
  DevBuf<float> h(size_t(Mfull) * I);
  check_invariance(rng, H, H, ldx, DType::F32, x, Mfull,
                   [&](const native::ActIn& a, int M, float* y, int64_t ld_y) {
                     native::dense_mlp(native::DenseWeight{gu.data.p, DType::BF16, gu.N, gu.K, gu.ld},
                                       native::DenseWeight{dn.data.p, DType::BF16, dn.N, dn.K, dn.ld}, a, M, 1.702f,
                                       7.f, h.p, I, y, ld_y, nullptr);
                   },
                   "dense_mlp 1024 -> 640 -> 1024");
  for (DType rt : {DType::F32, DType::BF16}) {
    // router weights [128][H]
    const int E = 128;
    std::normal_distribution<float> nd;
    const int64_t es = rt == DType::F32 ? 4 : 2, ld = H * es;
    std::vector<uint8_t> bytes(size_t(E) * size_t(ld));
    for (int e = 0; e < E; ++e)
      for (int k = 0; k < H; ++k) {
        const float v = nd(rng) * 0.05f;
        if (rt == DType::F32) std::memcpy(&bytes[size_t(e) * ld + 4 * k], &v, 4);
        else {
          const uint16_t b = f32_to_bf16(v);
          std::memcpy(&bytes[size_t(e) * ld + 2 * k], &b, 2);
        }
      }
    DevBuf<uint8_t> wd(bytes.size());
    wd.upload(bytes);
    for (auto path : {native::LinearPath::Gemv, native::LinearPath::Auto})
      check_invariance(rng, H, E, ldx, DType::F32, x, Mfull,
                       [&](const native::ActIn& a, int M, float* y, int64_t ld_y) {
                         native::linear_dense(native::DenseWeight{wd.p, rt, E, H, ld}, a, M, y, ld_y, nullptr, path);
                       },
                       fmt::format("router {} 128x{} {}", rt == DType::F32 ? "f32" : "bf16", H,
                                   path == native::LinearPath::Gemv ? "gemv" : "auto"));
  }
}

// ---- bench (M3_BENCH=1) ----

namespace {

// The norm's halves fused into the projections (kernels/fused_norm_params.h): the O projection as
// producer (nout: its outputs added into the residual stream, z and the chunk sums written instead
// of y) gives bit for bit what the host makes of the plain projection's outputs; the qkv
// projection as consumer gives the same bits with inv computed from the chunk sums (nin.ss) and
// with inv handed in (nin.inv), equal to the plain projection's outputs times inv. The register
// walk and the streamed tile, M = 1 .. 8. Outputs poisoned first.
TEST(GpuMmaLinear, NormHalvesFusedIntoTheProjections) {
  const uint32_t seed = gpu_test_seed() + 41;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int H = 6144, Ko = 2048, Nq = 2560;
  const DevWeight wo = random_weight(rng, DType::F8_E4M3, H, Ko), wq = random_weight(rng, DType::F8_E4M3, Nq, H);
  std::vector<uint16_t> nw(static_cast<size_t>(H));
  for (auto& v : nw) v = f32_to_bf16(nd(rng) * 0.2f);
  DevBuf<uint16_t> dnw(nw.size());
  M3_CUDA_CHECK(cudaMemcpy(dnw.p, nw.data(), nw.size() * 2, cudaMemcpyHostToDevice));
  const float eps = 1e-6f;
  for (int M : {1, 3, 8})
    for (int stream : {0, 1}) {
      const std::string what = fmt::format("M {} stream {}", M, stream);
      SCOPED_TRACE(what);
      const native::MmaTiling tiling{1, 1, false, stream};
      const int64_t ldo = act_ld(Ko);
      const auto xo = random_x(rng, M, Ko, ldo);
      const DevAct ao = upload_act(xo, ldo, DType::F32);
      const std::vector<float> y = run_mma(wo, ao.in, M, H, false, tiling);
      std::vector<float> res0(size_t(M) * H);
      for (auto& v : res0) v = nd(rng) * 4.f;
      DevBuf<float> dres(res0.size()), dz(res0.size()), dss(size_t(M) * (H / 16)), unused(res0.size());
      DevBuf<uint16_t> dzs(size_t(M) * 2 * H);  // z split (act_split.cuh) for the consumer's split run
      dres.upload(res0);
      unused.poison();
      dz.poison();
      dss.poison();
      M3_CUDA_CHECK(cudaMemset(dzs.p, 0xff, dzs.n * 2));
      kernels::MmaLinearParams p = native::make_mma_linear_params(wo.data.p, wo.dt, wo.scale_ptr(), wo.ld, H, Ko, ao.in,
                                                                  M, unused.p, H, false, 1.702f, 7.f, tiling);
      p.nout = kernels::NormOut{dres.p, dnw.p, dz.p, dss.p, dzs.p, H, H};
      native::launch(p, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      const auto res = dres.download(), z = dz.download(), ss = dss.download(), y_left = unused.download();
      EXPECT_TRUE(std::all_of(y_left.begin(), y_left.end(), [](float v) { return std::isnan(v); }))
          << what << ": the producer wrote y";
      std::vector<float> r(size_t(M) * H), zref(r.size()), inv(static_cast<size_t>(M));
      for (size_t i = 0; i < r.size(); ++i) {
        r[i] = res0[i] + y[i];
        zref[i] = norm_z_host(r[i], nw[i % H]);
      }
      // the same fp32 operations on both sides: equal bits (atol 1e-30 only avoids 0/0)
      expect_close_rows(res, H, r, M, H, 1e-30, 0, what + " residual (exact)");
      expect_close_rows(z, H, zref, M, H, 1e-30, 0, what + " z (exact)");
      std::vector<uint16_t> zs_got(dzs.n);
      M3_CUDA_CHECK(cudaMemcpy(zs_got.data(), dzs.p, zs_got.size() * 2, cudaMemcpyDeviceToHost));
      const auto zs_want = split_rows_host(z, M, H, H);
      size_t zs_bad = 0;
      for (size_t i = 0; i < zs_got.size(); ++i) zs_bad += zs_got[i] != zs_want[i];
      EXPECT_EQ(zs_bad, 0u) << what << ": the producer's split of z differs from the host's in " << zs_bad << " of "
                            << zs_got.size() << " halves";
      for (int t = 0; t < M; ++t) {
        const auto want = norm_chunk_sums(r.data() + size_t(t) * H, H);
        expect_close_rows(std::vector<float>(ss.begin() + size_t(t) * (H / 16), ss.begin() + size_t(t + 1) * (H / 16)),
                          H / 16, want, 1, H / 16, 1e-30, 0, what + " chunk sums (exact)");
        inv[size_t(t)] = norm_inv_from_chunks(want, H, eps);
      }
      // the consumer: qkv over z, inv from the chunk sums and handed in
      const native::ActIn zin{dz.p, DType::F32, H};
      const std::vector<float> plain = run_mma(wq, zin, M, Nq, false, tiling);
      DevBuf<float> dinv(static_cast<size_t>(M));
      dinv.upload(inv);
      std::vector<float> got[3];
      for (int mode = 0; mode < 3; ++mode) {  // inv from the chunk sums, handed in; from the sums over z split
        if (mode == 2 && stream) continue;  // (split activations: the register walk only)
        DevBuf<float> yq(size_t(M) * Nq);
        yq.poison();
        kernels::MmaLinearParams q = native::make_mma_linear_params(wq.data.p, wq.dt, wq.scale_ptr(), wq.ld, Nq, H, zin,
                                                                    M, yq.p, Nq, false, 1.702f, 7.f, tiling);
        q.nin = mode == 1 ? kernels::NormIn{nullptr, dinv.p, H, M, eps} : kernels::NormIn{dss.p, nullptr, H, M, eps};
        if (mode == 2) {
          EXPECT_TRUE(native::use_split_activations(q, dzs.p));
        }
        native::launch(q, nullptr);
        M3_CUDA_CHECK(cudaDeviceSynchronize());
        got[mode] = yq.download();
      }
      std::vector<float> want(plain.size());
      for (int t = 0; t < M; ++t)
        for (int n = 0; n < Nq; ++n) want[size_t(t) * Nq + n] = plain[size_t(t) * Nq + n] * inv[size_t(t)];
      expect_close_rows(got[0], Nq, want, M, Nq, 1e-30, 0, what + " consumer, inv from the chunk sums (exact)");
      expect_close_rows(got[1], Nq, want, M, Nq, 1e-30, 0, what + " consumer, inv handed in (exact)");
      if (!stream) expect_close_rows(got[2], Nq, want, M, Nq, 1e-30, 0, what + " consumer over z split (exact)");
    }
}

bool bench_on() {
  const char* v = std::getenv("M3_BENCH");
  return v && *v && *v != '0';
}

// Median time of one launch: fn(i, s) for i in [0, n) captured into one graph, replayed.
double graph_us(int n, const std::function<void(int, cudaStream_t)>& fn, int reps = 15) {
  cudaStream_t s;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < n; ++i) fn(i, s);  // eager first (checks, module load)
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  M3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) fn(i, s);
  M3_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  M3_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  M3_CUDA_CHECK(cudaEventCreate(&a));
  M3_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ts;
  for (int r = 0; r < reps + 3; ++r) {
    M3_CUDA_CHECK(cudaEventRecord(a, s));
    M3_CUDA_CHECK(cudaGraphLaunch(ge, s));
    M3_CUDA_CHECK(cudaEventRecord(b, s));
    M3_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) ts.push_back(double(ms) * 1000.0 / n);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

TEST(GpuMmaLinearBench, TilingsVsGemvAndRead) {
  if (!bench_on()) GTEST_SKIP() << "set M3_BENCH=1";
  struct Shape {
    int N, K;
    const char* name;
  };
  DevBuf<uint32_t> sink(1056);
  std::printf("\n%-26s %5s %8s %8s | tilings us (read %%): wide 1x1, 1x2, 2x1, 2x2, 4x1, deep 4x4 | by-M pick\n",
              "shape (fp8, x f32)", "M", "read us", "gemv us");
  for (Shape sh : {Shape{2560, 6144, "qkv tp4 2560x6144"}, Shape{9856, 6144, "qkv tp1 9856x6144"},
                   Shape{6144, 2048, "o tp4 6144x2048"}, Shape{6144, 8192, "o tp1 6144x8192"}}) {
    const int64_t ld = (sh.K + 15) / 16 * 16;
    const size_t cb = size_t(sh.N) * size_t(ld), one = (cb + size_t(sh.N) * 4 + 255) / 256 * 256;
    const int nb = int(std::max<size_t>(3, (size_t(240) << 20) / one + 1));
    DevBuf<uint8_t> w(one * size_t(nb));
    fill_random_device(w.p, w.n, 7, FillKind::Fp8NoNan);
    for (int i = 0; i < nb; ++i) {
      std::vector<float> sc(size_t(sh.N), 1e-3f);
      M3_CUDA_CHECK(cudaMemcpy(w.p + size_t(i) * one + cb, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    }
    const double read_us =
        graph_us(nb, [&](int i, cudaStream_t s) { plain_read_async(w.p + size_t(i) * one, cb + size_t(sh.N) * 4, sink.p, s); });
    std::mt19937 rng(5);
    const int Mmax = 2048;
    const auto xh = random_x(rng, Mmax, sh.K, ld);
    DevAct xa = upload_act(xh, ld, DType::F32);
    DevBuf<float> y(size_t(Mmax) * size_t(sh.N));
    auto view = [&](int i) {
      const uint8_t* p = w.p + size_t(i) * one;
      return native::Fp8Weight{p, reinterpret_cast<const float*>(p + cb), sh.N, sh.K, ld};
    };
    for (int M : {1, 2, 4, 8, 16, 32, 64, 2048}) {
      const int reps = M >= 1024 ? 1 : nb;
      std::string line = fmt::format("{:<26} {:>5} {:>8.2f} ", sh.name, M, read_us);
      if (M <= 64) {
        const double g = graph_us(reps, [&](int i, cudaStream_t s) {
          native::linear_fp8(view(i), xa.in, M, y.p, sh.N, s, native::LinearPath::Gemv);
        });
        line += fmt::format("{:>8.2f} |", g);
      } else {
        line += fmt::format("{:>8} |", "-");
      }
      for (const auto& t : all_tilings()) {
        if (M >= 1024 && !t.deep && t.rt * t.nt < 4) {
          line += fmt::format(" {:>13}", "-");
          continue;
        }
        const double us = graph_us(reps, [&](int i, cudaStream_t s) {
          const auto v = view(i);
          native::mma_linear(v.codes, DType::F8_E4M3, v.scales, v.ld, v.rows, v.cols, xa.in, M, y.p, sh.N, false, 0,
                             0, s, t);
        });
        if (M >= 1024)
          line += fmt::format(" {:>6.1f} {:>4.0f}TF", us, 2.0 * M * sh.N * sh.K / us * 1e-6);
        else
          line += fmt::format(" {:>6.2f} ({:>3.0f}%)", us, 100.0 * read_us / us);
      }
      const auto pick = native::mma_tiling_for(sh.N, sh.K, M);
      line += fmt::format(" | {} {}x{}", pick.deep ? "deep" : "wide", pick.rt, pick.nt);
      std::printf("%s\n", line.c_str());
    }
  }
}
