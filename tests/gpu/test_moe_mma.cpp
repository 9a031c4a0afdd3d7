// The MXFP4 expert projections on tensor cores (kernels/moe_mma.cuh through native::moe_forward):
//  - accuracy, per pair (token, expert) of the GPU's own routing: the SwiGLU outputs h (workspace)
//    against the double SwiGLU of double gate/up products of the dequantized expert rows and the
//    token's activations; the down outputs y against a double product with the GPU's own h; the
//    layer output against the double combine of the GPU's y and routing weights. Every element
//    against its own bound (derived at coef() below), the worst printed. Real per-rank shapes
//    (128 experts, H 6144, shared expert in slot 128; TP 4: I 768, M = 1..9, 17, 300; TP 1: I 3072,
//    M = 1, 8) and odd shapes with top-8 routing (H 333, I 257, a shared expert of width 130;
//    H 200, I 96, shared in slot), M = 1..9, 17, 300.
//  - batch invariance: every token's output of a 300-token batch is bitwise the same run alone and
//    inside random batches (random sizes, compositions, orders), and the wide, deep and automatic
//    modes give the same bits.
//  - the same for MXFP8 experts (E4M3 codes, the MXFP8 release: the wide register walk at any M).
// Weights: random code bytes (all 16 E2M1 values, padding nibbles too: they must be cancelled by
// the zero activations past K) and random E8M0 scales (up to 128, the kernel's exact range),
// generated on the device; activations with full fp32 mantissas, so the lo half of the split
// matters. Outputs and the workspace (which holds the split activations and SwiGLU outputs: their
// elements past K are read in the last block and must be masked) poisoned with NaN before every
// run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "model/quantize.h"
#include "native/moe.h"
#include "test_gemv_util.h"
#include "test_moe_util.h"

using namespace m3;
using namespace m3::test;

namespace {

// One projection's device experts, filled at random on allocation.
struct Experts : DeviceExperts {
  void alloc(int s, int r, int c, uint64_t seed, int slo, int shi, bool mxfp8) {
    DeviceExperts::alloc(s, r, c, mxfp8);
    fill_random(seed, slo, shi);
  }
};

// The bound of one projection output over sum_k |w x| (the order of kernels/moe_mma.cuh's header):
//  - the weights reach the MMA exactly (E2M1 times a power of two, S <= 128);
//  - x = hi + lo misses x by at most 2^-18 |x|;
//  - one MMA adds 16 exact products to its accumulator; assuming (as tests/gpu/test_mma_linear.cpp
//    does) that each addend is aligned to the largest and truncated, it errs by < 17 ulps of that
//    largest magnitude <= 34 u of the block's sum of |terms|, for the 16 MMAs (8 steps, hi and lo)
//    of a 128-element block;
//  - the chain adds at most B = ceil(K / 128) block sums, the total at most 16 chain sums: u each.
// The lo products add at most 2^-8 of |w x| to the magnitudes: the factor 1.01.
double coef(int K) {
  const int B = (K + 127) / 128;
  return 1.01 * (0x1p-18 + (16 * 34 + B + 16) * kU);
}

double swiglu_d(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

struct Worst {
  double ratio = 0;
  std::string where;
  int64_t bad = 0;
  template <class F>
  void add(double got, double ref, double bound, const F& where_fn) {
    const double err = std::fabs(got - ref);
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0 : INFINITY);
    if (!(ratio <= 1)) ++bad;
    if (!(ratio <= this->ratio)) {
      this->ratio = std::isnan(ratio) ? INFINITY : ratio;
      where = where_fn() + fmt::format(": got {:.9g} ref {:.9g} |d| {:.3g} bound {:.3g}", got, ref, err, bound);
    }
  }
  void merge(const Worst& o) {
    bad += o.bad;
    if (!(o.ratio <= ratio)) {
      ratio = o.ratio;
      where = o.where;
    }
  }
  void report(const std::string& what) const {
    EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of bound; worst " << where;
    std::printf("  %-50s worst |d|/bound %.3g (%s)\n", what.c_str(), ratio, where.c_str());
  }
};

struct Case {
  std::string name;
  int E, K, H, I, S;  // S: shared width (0 none; == I in slot; else its own tensors)
  int slo, shi;       // E8M0 scale range of the weights
  std::vector<int> Ms;
  bool fp8 = false;   // MXFP8 experts (E4M3 codes), else MXFP4
};

struct Layer {  // one MoE layer on the device
  Case c;
  bool in_slot = false, separate = false;
  Experts w13, w2, sw13, sw2;
  DevBuf<uint8_t> router;
  DevBuf<float> bias;
  native::MoeWeights w;

  explicit Layer(const Case& cs, uint32_t seed) : c(cs) {
    in_slot = c.S > 0 && c.S == c.I;
    separate = c.S > 0 && c.S != c.I;
    const int slots = c.E + (in_slot ? 1 : 0);
    w13.alloc(slots, 2 * c.I, c.H, seed + 1, c.slo, c.shi, c.fp8);
    w2.alloc(slots, c.H, c.I, seed + 3, c.slo, c.shi, c.fp8);
    if (separate) {
      sw13.alloc(1, 2 * c.S, c.H, seed + 5, c.slo, c.shi, c.fp8);
      sw2.alloc(1, c.H, c.S, seed + 7, c.slo, c.shi, c.fp8);
    }
    std::mt19937 rng(seed + 9);
    std::normal_distribution<float> nd;
    const int64_t rld = (int64_t(c.H) * 4 + 15) / 16 * 16;
    std::vector<uint8_t> rb(size_t(c.E) * rld, 0);
    for (int e = 0; e < c.E; ++e)
      for (int k = 0; k < c.H; ++k) {
        const float v = nd(rng) * 0.02f;
        std::memcpy(&rb[size_t(e) * rld + size_t(k) * 4], &v, 4);
      }
    router = DevBuf<uint8_t>(rb.size());
    router.upload(rb);
    std::vector<float> bv(size_t(c.E));
    for (auto& b : bv) b = nd(rng) * 0.05f;
    bias = DevBuf<float>(bv.size());
    bias.upload(bv);
    w.router = native::DenseWeight{router.p, DType::F32, c.E, c.H, rld};
    w.router_bias = bias.p;
    w.w13 = w13.view();
    w.w2 = w2.view();
    w.shared_in_slot = in_slot;
    if (separate) {
      w.shared_w13 = sw13.view();
      w.shared_w2 = sw2.view();
    }
    w.E = c.E;
    w.K = c.K;
    w.routed_scale = 2.0f;
  }
  int64_t ldx() const { return (c.H + 3) / 4 * 4 + 4; }
};

// Activations with full fp32 mantissas, a per-row scale; zero padding.
std::vector<float> acts(std::mt19937& rng, int M, int H, int64_t ld) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  std::vector<float> x(size_t(M) * size_t(ld), 0.f);
  for (int t = 0; t < M; ++t) {
    const float s = sc(rng);
    for (int k = 0; k < H; ++k) x[size_t(t) * ld + k] = nd(rng) * s;
  }
  return x;
}

struct Run {
  std::vector<float> out;  // [M][H] (ld H + 3)
  int64_t ld_out = 0;
  std::vector<int32_t> ids, pos;
  std::vector<float> wts, h, y;
  int64_t ld_h = 0;
};

// moe_forward on poisoned outputs and workspace; `full` also downloads the workspace.
Run forward(const Layer& L, const std::vector<float>& x, int M, bool full) {
  const int H = L.c.H;
  Run r;
  r.ld_out = H + 3;
  DevBuf<float> xd(x.size());
  xd.upload(x);
  const size_t wsb = native::moe_workspace_bytes(L.w, M);
  DevBuf<uint8_t> ws(wsb);
  M3_CUDA_CHECK(cudaMemset(ws.p, 0xff, wsb));
  DevBuf<float> out(size_t(M) * size_t(r.ld_out));
  out.poison();
  native::moe_forward(L.w, xd.p, L.ldx(), M, out.p, r.ld_out, ws.p, wsb, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  r.out = out.download();
  if (full) {
    auto v = native::moe_workspace(L.w, M, ws.p);
    const int MK = M * L.c.K, pairs = MK + M;
    r.ld_h = v.ld_h;
    r.ids.resize(size_t(MK));
    r.pos.resize(size_t(MK));
    r.wts.resize(size_t(MK));
    r.h.resize(size_t(pairs) * size_t(v.ld_h));
    r.y.resize(size_t(pairs) * size_t(H));
    M3_CUDA_CHECK(cudaMemcpy(r.ids.data(), v.ids, size_t(MK) * 4, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(r.pos.data(), v.pos_of, size_t(MK) * 4, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(r.wts.data(), v.weights, size_t(MK) * 4, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(r.h.data(), v.h, r.h.size() * 4, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(r.y.data(), v.y, r.y.size() * 4, cudaMemcpyDeviceToHost));
  }
  return r;
}

void accuracy_case(const Case& c) {
  const uint32_t seed = gpu_test_seed() ^ uint32_t(c.H * 131 + c.I * 7 + c.K);
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  std::printf("%s (seed %u)\n", c.name.c_str(), seed);
  Layer L(c, seed);
  std::mt19937 rng(seed + 11);
  const int H = c.H;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> cache;  // slot (-1: separate shared)
  auto dq = [&](int slot) -> const std::pair<std::vector<float>, std::vector<float>>& {
    auto it = cache.find(slot);
    if (it != cache.end()) return it->second;
    auto& e = cache[slot];
    if (slot < 0) e = {L.sw13.dequant(0), L.sw2.dequant(0)};
    else e = {L.w13.dequant(slot), L.w2.dequant(slot)};
    return e;
  };
  const double c13 = coef(H);
  for (int M : c.Ms) {
    const int64_t ldx = L.ldx();
    const std::vector<float> x = acts(rng, M, H, ldx);
    const Run r = forward(L, x, M, true);
    const int MK = M * c.K;
    // pairs: (pair, token, slot) for routed and shared
    struct P {
      int pair, t, slot, width;
    };
    std::vector<P> ps;
    for (int t = 0; t < M; ++t)
      for (int k = 0; k < c.K; ++k) {
        const int e = r.ids[size_t(t) * c.K + k], p = r.pos[size_t(t) * c.K + k];
        ASSERT_TRUE(e >= 0 && e < c.E && p >= 0 && p < MK) << "token " << t << " choice " << k << ": expert " << e
                                                           << " pair " << p;
        ps.push_back({p, t, e, c.I});
      }
    if (L.in_slot)
      for (int t = 0; t < M; ++t) ps.push_back({MK + t, t, c.E, c.I});
    if (L.separate)
      for (int t = 0; t < M; ++t) ps.push_back({MK + t, t, -1, c.S});
    std::sort(ps.begin(), ps.end(), [](const P& a, const P& b) { return a.slot < b.slot; });
    Worst wh, wy;
    for (const P& q : ps) {
      const auto& m = dq(q.slot);
      const int I = q.width;
      const float* xt = x.data() + size_t(q.t) * ldx;
      const float* hg = r.h.data() + size_t(q.pair) * r.ld_h;
      const float* yg = r.y.data() + size_t(q.pair) * H;
      const double c2 = coef(I);
      std::vector<Worst> part_h(static_cast<size_t>(I)), part_y(static_cast<size_t>(H));
      pool().parallel_for(I, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) {
          const float* wg = m.first.data() + size_t(2 * j) * H;
          const float* wu = wg + H;
          double g = 0, u = 0, mg = 0, mu = 0;
          for (int k = 0; k < H; ++k) {
            g += double(wg[k]) * xt[k];
            u += double(wu[k]) * xt[k];
            mg += std::fabs(double(wg[k]) * xt[k]);
            mu += std::fabs(double(wu[k]) * xt[k]);
          }
          const double ref = swiglu_d(g, u, L.w.alpha, L.w.limit);
          const double gc = std::min(g, double(L.w.limit)), uc = std::clamp(u, -double(L.w.limit), double(L.w.limit));
          const double sig = 1 / (1 + std::exp(-L.w.alpha * gc));
          const double dg = std::fabs((uc + 1) * (sig + L.w.alpha * gc * sig * (1 - sig)));
          const double du = std::fabs(gc * sig);
          // gate/up bounds through the slopes (doubled for the curvature) + the fp32 SwiGLU (16 u)
          const double bound = 2 * (dg * c13 * mg + du * c13 * mu) + 16 * kU * std::fabs((uc + 1) * gc) + 1e-30;
          part_h[size_t(j)].add(hg[j], ref, bound, [&] {
            return fmt::format("pair {} token {} slot {} j {}", q.pair, q.t, q.slot, j);
          });
        }
      });
      pool().parallel_for(H, [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; ++n) {
          const float* w2 = m.second.data() + size_t(n) * I;
          double s = 0, mag = 0;
          for (int k = 0; k < I; ++k) {
            s += double(w2[k]) * hg[k];
            mag += std::fabs(double(w2[k]) * hg[k]);
          }
          part_y[size_t(n)].add(yg[n], s, c2 * mag + 1e-30,
                                [&] { return fmt::format("pair {} token {} slot {} n {}", q.pair, q.t, q.slot, n); });
        }
      });
      for (auto& w : part_h) wh.merge(w);
      for (auto& w : part_y) wy.merge(w);
    }
    // the combine: fp32 fmas in k order after the shared output: <= (K + 1) roundings of partial
    // sums bounded by the sum of |terms|
    Worst wo;
    const bool sh = L.in_slot || L.separate;
    for (int t = 0; t < M; ++t)
      for (int n = 0; n < H; ++n) {
        double s = sh ? r.y[size_t(MK + t) * H + n] : 0.0, mag = std::fabs(s);
        for (int k = 0; k < c.K; ++k) {
          const double term = double(r.wts[size_t(t) * c.K + k]) * r.y[size_t(r.pos[size_t(t) * c.K + k]) * H + n];
          s += term;
          mag += std::fabs(term);
        }
        wo.add(r.out[size_t(t) * r.ld_out + n], s, (c.K + 2) * kU * mag + 1e-30,
               [&] { return fmt::format("token {} n {}", t, n); });
      }
    const std::string tag = c.name + " M=" + std::to_string(M);
    wh.report(tag + " h (gate/up + SwiGLU)");
    wy.report(tag + " y (down)");
    wo.report(tag + " out (combine)");
  }
}

// Every token of `sel` (indices into the 300-token batch x) run as one batch gives the full run's
// output row, bit for bit.
void expect_rows_equal(const Layer& L, const std::vector<float>& x, const std::vector<float>& full_out,
                       int64_t ld_full, const std::vector<int>& sel, const std::string& what) {
  const int64_t ldx = L.ldx();
  std::vector<float> xs(sel.size() * size_t(ldx));
  for (size_t i = 0; i < sel.size(); ++i)
    std::memcpy(&xs[i * size_t(ldx)], &x[size_t(sel[i]) * ldx], size_t(ldx) * 4);
  const Run r = forward(L, xs, int(sel.size()), false);
  int bad = 0, first = -1;
  for (size_t i = 0; i < sel.size(); ++i)
    if (std::memcmp(&r.out[i * size_t(r.ld_out)], &full_out[size_t(sel[i]) * ld_full], size_t(L.c.H) * 4) != 0) {
      ++bad;
      if (first < 0) first = int(i);
    }
  EXPECT_EQ(bad, 0) << what << " (" << sel.size() << " tokens): " << bad
                    << " rows differ from the full batch, first at "
                    << first << " (token " << (first >= 0 ? sel[size_t(first)] : -1) << ")";
}

void invariance_case(const Case& c) {
  const uint32_t seed = gpu_test_seed() ^ uint32_t(c.H * 977 + c.I * 13 + c.K);
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  std::printf("%s invariance (seed %u)\n", c.name.c_str(), seed);
  Layer L(c, seed);
  std::mt19937 rng(seed + 17);
  constexpr int kFull = 300;
  const std::vector<float> x = acts(rng, kFull, c.H, L.ldx());
  native::moe_set_kernel(native::MoeKernel::Auto);
  const Run full = forward(L, x, kFull, false);
  // no NaN in the written outputs
  int nan = 0;
  for (int t = 0; t < kFull; ++t)
    for (int n = 0; n < c.H; ++n) nan += std::isnan(full.out[size_t(t) * full.ld_out + n]) ? 1 : 0;
  EXPECT_EQ(nan, 0) << "NaN outputs in the full batch";
  std::vector<int> all(kFull);
  std::iota(all.begin(), all.end(), 0);
  for (auto k : {native::MoeKernel::Wide, native::MoeKernel::Deep}) {
    native::moe_set_kernel(k);
    expect_rows_equal(L, x, full.out, full.ld_out, all,
                      k == native::MoeKernel::Wide ? "wide, full batch" : "deep, full batch");
  }
  native::moe_set_kernel(native::MoeKernel::Auto);
  std::vector<int> sizes = {1, 2, 7, 9, 17, 64, 150, 299};
  for (int i = 0; i < 4; ++i) sizes.push_back(std::uniform_int_distribution<int>(1, kFull)(rng));
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int> sel = all;
    std::shuffle(sel.begin(), sel.end(), rng);
    sel.resize(size_t(sizes[i]));
    const auto mode = i % 3 == 0   ? native::MoeKernel::Auto
                      : i % 3 == 1 ? native::MoeKernel::Wide
                                   : native::MoeKernel::Deep;
    native::moe_set_kernel(mode);
    expect_rows_equal(L, x, full.out, full.ld_out, sel,
                      fmt::format("random batch {} ({})", i, mode == native::MoeKernel::Auto ? "auto"
                                                             : mode == native::MoeKernel::Wide ? "wide"
                                                                                               : "deep"));
  }
  // every token alone (a sample of them: each is a whole launch sequence)
  for (int i = 0; i < 12; ++i) {
    const int t = std::uniform_int_distribution<int>(0, kFull - 1)(rng);
    expect_rows_equal(L, x, full.out, full.ld_out, {t}, "alone");
  }
  native::moe_set_kernel(native::MoeKernel::Auto);
}

}  // namespace

TEST(GpuMoeMma, AccuracyRealTp4) {
  native::moe_set_kernel(native::MoeKernel::Auto);
  accuracy_case({"real tp4 E128 k4 H6144 I768 shared-in-slot", 128, 4, 6144, 768, 768, 119, 121,
                 {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 300}});
}
TEST(GpuMoeMma, AccuracyRealTp1) {
  native::moe_set_kernel(native::MoeKernel::Auto);
  accuracy_case({"real tp1 E128 k4 H6144 I3072 shared-in-slot", 128, 4, 6144, 3072, 3072, 119, 121, {1, 8}});
}
TEST(GpuMoeMma, AccuracyOddTop8) {
  native::moe_set_kernel(native::MoeKernel::Auto);
  accuracy_case({"odd E20 k8 H333 I257 shared 130", 20, 8, 333, 257, 130, 110, 128,
                 {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 300}});
  accuracy_case({"odd E12 k8 H200 I96 shared-in-slot", 12, 8, 200, 96, 96, 100, 128, {5, 300}});
  native::moe_set_kernel(native::MoeKernel::Deep);
  accuracy_case({"odd E9 k3 H160 I64 no shared, deep", 9, 3, 160, 64, 0, 115, 125, {1, 4, 33}});
  native::moe_set_kernel(native::MoeKernel::Auto);
}
// MXFP8 experts (the MXFP8 release; MoeWideFp8Op): the same bounds (the weights reach the MMA
// exactly: E4M3 times 2^(S - 127) for S in 4 .. 134). Scales 2^-19 .. 2^-13 for the real shapes
// (|w| up to ~0.05, as the MXFP4 cases), the odd shapes across 2^-67 .. 2^7 (products stay normal
// fp32); the deep walk (MoeDeepFp8Op) forced on one case, and compared bitwise with the wide walk
// by InvarianceMxfp8.
TEST(GpuMoeMma, AccuracyMxfp8) {
  native::moe_set_kernel(native::MoeKernel::Auto);
  accuracy_case({"mxfp8 real tp4 E128 k4 H6144 I768 shared-in-slot", 128, 4, 6144, 768, 768, 108, 114,
                 {1, 2, 4, 8, 9, 17, 300}, true});
  accuracy_case({"mxfp8 odd E20 k8 H333 I257 shared 130", 20, 8, 333, 257, 130, 60, 134, {1, 3, 9, 300}, true});
  native::moe_set_kernel(native::MoeKernel::Deep);
  accuracy_case({"mxfp8 odd E9 k3 H160 I64 no shared, deep", 9, 3, 160, 64, 0, 100, 130, {1, 4, 33}, true});
  native::moe_set_kernel(native::MoeKernel::Auto);
}
TEST(GpuMoeMma, InvarianceMxfp8) {
  invariance_case({"mxfp8 real tp4 E128 k4 H6144 I768 shared-in-slot", 128, 4, 6144, 768, 768, 108, 114, {}, true});
  invariance_case({"mxfp8 odd E20 k8 H333 I257 shared 130", 20, 8, 333, 257, 130, 60, 134, {}, true});
}
TEST(GpuMoeMma, Invariance) {
  invariance_case({"real tp4 E128 k4 H6144 I768 shared-in-slot", 128, 4, 6144, 768, 768, 119, 121, {}});
  invariance_case({"odd E20 k8 H333 I257 shared 130", 20, 8, 333, 257, 130, 110, 128, {}});
}
