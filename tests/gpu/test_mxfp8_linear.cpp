// The MXFP8 weight format of the tensor-core linear kernel (issue 17; kernels/mma_linear.cuh,
// WRun<MXFP8>): E4M3 codes with one E8M0 scale per 32 elements of a row, multiplied into the bf16
// operand exactly. Each E4M3 value times 2^(S - 127) is a bf16 value, so the kernel must give
// bitwise what the BF16 kernel gives on the dequantized weights (the "BF16 twin"): the same
// operands in the same MMA positions and the same chain order. Checked on fresh random codes (all
// finite codes, subnormals included) and scales (the whole accepted range 4 .. 134 in one shape,
// a checkpoint-like spread in the others), row-major and tiled codes, fp32 and bf16 activations,
// every tiling, M from 1 to 300; outputs poisoned before each run, every element compared (memcmp)
// and checked finite. The twin's own accuracy is GpuMmaLinear.*'s. Refusals: row scales and
// block scales together, too few scale bytes, the GEMV on MXFP8.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/codecs.h"
#include "core/weight_tiles.h"
#include "native/linear.h"
#include "native/weight_tiles.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

struct MxWeight {
  int N = 0, K = 0;
  int64_t ld = 0, ld_mx = 0, ld_bf16 = 0;  // bytes
  DevBuf<uint8_t> codes, tiled, mx, twin;  // twin: BF16 [N][ld_bf16]
};

// wide: scales uniform over the accepted 4 .. 134; else 127 + U(-24, 2) (weights of ~2^-15 .. 2^10).
MxWeight random_mx(std::mt19937& rng, int N, int K, bool wide) {
  MxWeight w;
  w.N = N;
  w.K = K;
  w.ld = (K + kTileBlockBytes - 1) / kTileBlockBytes * kTileBlockBytes;  // tiled codes need whole blocks
  w.ld_mx = (K + 31) / 32 + 5;                                          // a stride that is not the width
  w.ld_bf16 = (int64_t(K) * 2 + 15) / 16 * 16;
  std::vector<uint8_t> codes(size_t(N) * size_t(w.ld), 0), mx(size_t(N) * size_t(w.ld_mx), 0xff),
      twin(size_t(N) * size_t(w.ld_bf16), 0);
  std::uniform_int_distribution<int> code(0, 253), sc(wide ? 4 : 103, wide ? 134 : 129);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < (K + 31) / 32; ++j) mx[size_t(n) * w.ld_mx + j] = uint8_t(sc(rng));
    for (int k = 0; k < K; ++k) {
      int c = code(rng);
      if ((c & 0x7f) == 0x7f) c = 0x7e;  // NaN codes: never written by a quantizer
      codes[size_t(n) * w.ld + k] = uint8_t(c);
      const int s = mx[size_t(n) * w.ld_mx + k / 32];
      const float v = e4m3_to_f32(uint8_t(c)) * std::ldexp(1.f, s - 127);
      const uint16_t h = f32_to_bf16(v);
      EXPECT_EQ(bf16_to_f32(h), v) << "code " << c << " scale " << s << " is not a bf16 value";
      std::memcpy(&twin[size_t(n) * w.ld_bf16 + 2 * size_t(k)], &h, 2);
    }
  }
  w.codes = DevBuf<uint8_t>(codes.size());
  w.codes.upload(codes);
  w.mx = DevBuf<uint8_t>(mx.size());
  w.mx.upload(mx);
  w.twin = DevBuf<uint8_t>(twin.size());
  w.twin.upload(twin);
  w.tiled = DevBuf<uint8_t>(size_t(tiled_rows(N)) * size_t(w.ld));
  native::tile_fp8(w.codes.p, N, w.ld, w.tiled.p, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

std::vector<float> random_act(std::mt19937& rng, int M, int K, int64_t ld) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ex(-3.f, 3.f);
  std::vector<float> x(size_t(M) * size_t(ld), std::nanf(""));  // NaN past K: must be masked
  for (int t = 0; t < M; ++t) {
    const float s = std::exp2(ex(rng));
    for (int k = 0; k < K; ++k) x[size_t(t) * ld + k] = nd(rng) * s;
  }
  return x;
}

std::vector<float> run(const kernels::MmaLinearParams& p, float* y, size_t n) {
  M3_CUDA_CHECK(cudaMemset(y, 0xff, n * 4));  // NaN
  native::launch(p, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> v(n);
  M3_CUDA_CHECK(cudaMemcpy(v.data(), y, n * 4, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

TEST(GpuMxfp8Linear, IsTheKernelOnItsBf16TwinBitwise) {
  const uint32_t seed = gpu_test_seed() + 41;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  struct S {
    int N, K;
    bool wide;
  };
  const std::vector<native::MmaTiling> tilings{{1, 1, false, 0}, {1, 1, false, 1}, {1, 2, false}, {2, 1, false},
                                               {2, 2, false},    {4, 1, false},    {4, 4, true}};
  int compared = 0;
  for (S s : {S{1, 17, false}, S{17, 65, false}, S{33, 2049, true}, S{257, 333, false}, S{1000, 1000, false},
              S{2560, 6144, false}, S{130, 64, true}}) {
    const MxWeight w = random_mx(rng, s.N, s.K, s.wide);
    const int64_t ldx = (s.K + 7) / 8 * 8 + 8;
    const auto x = random_act(rng, 300, s.K, ldx);
    for (DType xt : {DType::F32, DType::BF16}) {
      std::vector<uint8_t> xb;
      if (xt == DType::BF16) {
        for (float v : x) {
          const uint16_t h = f32_to_bf16(v);
          xb.push_back(uint8_t(h));
          xb.push_back(uint8_t(h >> 8));
        }
      } else {
        xb.resize(x.size() * 4);
        std::memcpy(xb.data(), x.data(), xb.size());
      }
      DevBuf<uint8_t> xd(xb.size());
      xd.upload(xb);
      const native::ActIn a{xd.p, xt, ldx};
      for (int M : {1, 2, 4, 8, 9, 17, 64, 300}) {
        const int64_t ld_y = s.N + 3;
        DevBuf<float> y(size_t(M) * size_t(ld_y));
        for (const auto& t : tilings) {
          const auto want = run(native::make_mma_linear_params(w.twin.p, DType::BF16, nullptr, w.ld_bf16, s.N, s.K, a,
                                                               M, y.p, ld_y, false, 0, 0, t),
                                y.p, y.n);
          for (bool tiled : {false, true}) {
            const native::Fp8Weight fw{tiled ? w.tiled.p : w.codes.p, nullptr, s.N, s.K, w.ld, tiled, w.mx.p, w.ld_mx};
            const auto got = run(native::make_fp8_linear_params(fw, a, M, y.p, ld_y, t), y.p, y.n);
            ++compared;
            int bad = 0, first = -1;
            for (int tk = 0; tk < M; ++tk)
              for (int n = 0; n < s.N; ++n) {
                const size_t i = size_t(tk) * ld_y + n;
                const bool same = std::isfinite(got[i]) && std::memcmp(&got[i], &want[i], 4) == 0;
                if (!same && bad++ == 0) first = int(i);
              }
            EXPECT_EQ(bad, 0) << fmt::format(
                "{}x{} M={} x {} {} {}x{}{} {}: {} outputs differ from the BF16 twin; first at token {} row {}: "
                "{:.9g} vs {:.9g}",
                s.N, s.K, M, xt == DType::F32 ? "f32" : "bf16", t.deep ? "deep" : "wide", t.rt, t.nt,
                t.stream == 1 ? " (streaming asked)" : "", tiled ? "tiled" : "row-major", bad,
                first < 0 ? -1 : first / int(ld_y), first < 0 ? -1 : first % int(ld_y), first < 0 ? 0.f : got[first],
                first < 0 ? 0.f : want[first]);
          }
        }
      }
    }
  }
  std::printf("  %d (shape, M, x format, tiling, layout) runs: MXFP8 == its BF16 twin bitwise\n", compared);
}

TEST(GpuMxfp8Linear, RefusesWhatItCannotRead) {
  std::mt19937 rng(gpu_test_seed() + 42);
  const MxWeight w = random_mx(rng, 16, 96, false);
  DevBuf<float> x(2 * 104), y(64), rs(16);
  const native::ActIn a{x.p, DType::F32, 104};
  // row scales and block scales at once
  EXPECT_THROW(native::make_fp8_linear_params(native::Fp8Weight{w.codes.p, rs.p, 16, 96, w.ld, false, w.mx.p, w.ld_mx},
                                              a, 1, y.p, 16),
               Error);
  // fewer scale bytes a row than 32-element blocks (96 columns: 3)
  EXPECT_THROW(
      native::make_fp8_linear_params(native::Fp8Weight{w.codes.p, nullptr, 16, 96, w.ld, false, w.mx.p, 2}, a, 1, y.p, 16),
      Error);
  // the CUDA-core GEMV reads row-scaled FP8 only
  EXPECT_THROW(native::linear_fp8(native::Fp8Weight{w.codes.p, nullptr, 16, 96, w.ld, false, w.mx.p, w.ld_mx}, a, 1, y.p,
                                  16, nullptr, native::LinearPath::Gemv),
               Error);
}
