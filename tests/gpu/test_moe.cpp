// The MXFP4 MoE layer on the GPU (native/moe.h) against ref::moe_forward on the same dequantized
// expert weights: real shapes (128 experts of 3072 x 6144, top 4, shared expert in slot 128; and
// the TP-4 width 768), weights generated on the device; odd shapes (333 hidden, 257 wide, 9
// experts, top 3) built with the host quantizer, with the shared expert in its slot or of its own
// width. Outputs poisoned first, every element checked; routing compared token by token; the
// result must be bitwise the same on a second run (no atomics).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "core/parallel.h"
#include "model/quantize.h"
#include "native/moe.h"
#include "ref/linear.h"
#include "ref/moe.h"
#include "test_gemv_util.h"
#include "test_moe_util.h"

using namespace m3;
using namespace m3::test;

namespace {

using ExpertStore = DeviceExperts;

// Slot of a projection as a reference matrix.
Mat dequant_mat(const ExpertStore& e, int slot) {
  Mat m;
  m.rows = e.rows;
  m.cols = e.cols;
  m.data = e.dequant(slot);
  return m;
}

MlpWeights expert_weights(const ExpertStore& w13, const ExpertStore& w2, int slot) {
  Mat gu = dequant_mat(w13, slot);
  MlpWeights m;
  const int I = gu.rows / 2;
  m.gate = Mat(I, gu.cols);
  m.up = Mat(I, gu.cols);
  for (int j = 0; j < I; ++j) {
    std::memcpy(m.gate.row(j), gu.row(2 * j), size_t(gu.cols) * 4);
    std::memcpy(m.up.row(j), gu.row(2 * j + 1), size_t(gu.cols) * 4);
  }
  m.down = dequant_mat(w2, slot);
  return m;
}

// Host-quantized slots: slot s of w13 from interleaved gate/up of `mlps[s]`, w2 from its down.
void upload_experts(const std::vector<MlpWeights>& mlps, ExpertStore& w13, ExpertStore& w2) {
  const int S = int(mlps.size()), I = mlps[0].gate.rows, H = mlps[0].gate.cols;
  w13.alloc(S, 2 * I, H);
  w2.alloc(S, H, I);
  std::vector<uint8_t> c13, s13, c2, s2;
  for (const auto& m : mlps) {
    Mat gu(2 * I, H);
    for (int j = 0; j < I; ++j) {
      std::memcpy(gu.row(2 * j), m.gate.row(j), size_t(H) * 4);
      std::memcpy(gu.row(2 * j + 1), m.up.row(j), size_t(H) * 4);
    }
    auto q = quantize_mxfp4(gu);
    c13.insert(c13.end(), q.codes.begin(), q.codes.end());
    s13.insert(s13.end(), q.scales.begin(), q.scales.end());
    auto d = quantize_mxfp4(m.down);
    c2.insert(c2.end(), d.codes.begin(), d.codes.end());
    s2.insert(s2.end(), d.scales.begin(), d.scales.end());
  }
  w13.codes.upload(c13);
  w13.scales.upload(s13);
  w2.codes.upload(c2);
  w2.scales.upload(s2);
}

// The down projection whose last item of each row tile combines it (kernels/moe_down_combine.cuh)
// against the down op then the combine: the same op list but its last two ops fused
// (native::fuse_down_combine, which must fuse exactly when the down op is the only one), bitwise the
// same output rows (want: moe_forward's, ld_out) and, with the next layer's norm prep fused into
// the combine (nout), the same residual rows, z and chunk sums; every row tile's counter back at 0.
void expect_down_combine_same(const native::MoeWeights& w, const float* x, int64_t ldx, int M, int H, void* ws,
                              size_t wsb, bool fusable, std::mt19937& rng, const std::vector<float>& want,
                              int64_t ldo) {
  std::normal_distribution<float> nd;
  const int tiles = (H + 31) / 32;
  DevBuf<int32_t> arrivals(static_cast<size_t>(tiles));
  M3_CUDA_CHECK(cudaMemset(arrivals.p, 0, size_t(tiles) * 4));
  std::vector<float> res0(size_t(M) * H);
  for (auto& v : res0) v = nd(rng);
  std::vector<uint16_t> nw(static_cast<size_t>(H));
  for (auto& v : nw) v = f32_to_bf16(nd(rng) * 0.2f);
  DevBuf<uint16_t> dnw(nw.size());
  M3_CUDA_CHECK(cudaMemcpy(dnw.p, nw.data(), nw.size() * 2, cudaMemcpyHostToDevice));
  for (const bool norm : {false, true}) {
    if (norm && H % 16 != 0) continue;
    SCOPED_TRACE(norm ? "with the norm's prep half" : "plain combine");
    // out (or the residual rows), z and chunk sums of one run of the op list, fused or not
    auto run = [&](bool fuse) {
      DevBuf<float> out(size_t(M) * ldo), res(res0.size()), z(res0.size()), ss(size_t(M) * (H / 16 + 1));
      out.poison();
      z.poison();
      ss.poison();
      res.upload(res0);
      std::vector<native::OpCall> ops;
      native::add_moe_ops(ops, w, x, ldx, M, out.p, ldo, ws, wsb);
      if (norm) std::get<kernels::MoeCombineParams>(ops.back().params).nout =
          kernels::NormOut{res.p, dnw.p, z.p, ss.p, nullptr, H, H};
      // (the tensor-core walk only: M3_MOE_GEMV=1 runs the experts as GEMVs, which do not fuse)
      const bool wide = ops.size() >= 2 && ops[ops.size() - 2].kind == native::OpKind::MoeMma;
      native::set_moe_down_combine(fuse ? 1 : 0);
      const bool fused = native::fuse_down_combine(ops, arrivals.p, tiles);
      native::set_moe_down_combine(-1);
      EXPECT_EQ(fused, fuse && fusable && wide) << "M " << M;
      EXPECT_EQ(ops.back().kind == native::OpKind::MoeDownCombine, fused);
      for (const native::OpCall& op : ops) native::launch(op, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      const auto arr = arrivals.download();
      for (int i = 0; i < tiles; ++i) EXPECT_EQ(arr[size_t(i)], 0) << "row tile " << i << "'s counter, M " << M;
      std::vector<float> o = norm ? res.download() : out.download();
      if (norm) {
        const auto zz = z.download(), sv = ss.download();
        o.insert(o.end(), zz.begin(), zz.end());
        o.insert(o.end(), sv.begin(), sv.begin() + int64_t(M) * (H / 16));
      }
      return o;
    };
    const std::vector<float> a = run(false), b = run(true);
    if (!norm) {  // the unfused list is moe_forward's
      ASSERT_EQ(a.size(), want.size());
      EXPECT_EQ(std::memcmp(a.data(), want.data(), a.size() * 4), 0) << "M " << M;
    }
    ASSERT_EQ(a.size(), b.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], 4) != 0 && !bad++) first = i;
    EXPECT_EQ(bad, 0u) << "M " << M << ": " << bad << " of " << a.size() << " values differ, the first at " << first
                       << " (" << a[first] << " vs " << b[first] << ")";
  }
}

struct MoeCase {
  std::string name;
  int E, K, H, I, S;      // S: shared width (0 none; == I: in slot)
  bool host_weights;      // false: random codes generated on the device (real shapes)
  std::vector<int> Ms;
};

void run_case(const MoeCase& c) {
  const uint32_t seed = gpu_test_seed() ^ uint32_t(c.H * 131 + c.I);
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const bool in_slot = c.S > 0 && c.S == c.I, separate = c.S > 0 && c.S != c.I;
  const int slots = c.E + (in_slot ? 1 : 0);

  ExpertStore w13, w2, sw13, sw2;
  if (c.host_weights) {
    std::vector<MlpWeights> mlps(static_cast<size_t>(slots));
    auto rnd = [&](int r, int k, float s) {
      Mat m(r, k);
      for (auto& v : m.data) v = nd(rng) * s;
      return m;
    };
    for (auto& m : mlps) {
      m.gate = rnd(c.I, c.H, 0.05f);
      m.up = rnd(c.I, c.H, 0.05f);
      m.down = rnd(c.H, c.I, 0.05f);
    }
    upload_experts(mlps, w13, w2);
    if (separate) {
      std::vector<MlpWeights> sh(1);
      sh[0].gate = rnd(c.S, c.H, 0.05f);
      sh[0].up = rnd(c.S, c.H, 0.05f);
      sh[0].down = rnd(c.H, c.S, 0.05f);
      upload_experts(sh, sw13, sw2);
    }
  } else {
    w13.alloc(slots, 2 * c.I, c.H);
    w2.alloc(slots, c.H, c.I);
    // codes uniform over all E2M1 values; block scales 2^-8..2^-6 so sums over thousands of
    // inputs stay O(1) and SwiGLU sees both its clamp and its smooth part
    fill_random_device(w13.codes.p, w13.codes.n, seed + 1, FillKind::Bytes);
    fill_random_device(w13.scales.p, w13.scales.n, seed + 2, FillKind::E8M0Range, 119, 121);
    fill_random_device(w2.codes.p, w2.codes.n, seed + 3, FillKind::Bytes);
    fill_random_device(w2.scales.p, w2.scales.n, seed + 4, FillKind::E8M0Range, 119, 121);
  }
  // router fp32 [E][H] (rows padded to 16 bytes) and bias
  const int64_t rld = (int64_t(c.H) * 4 + 15) / 16 * 16;
  Mat router(c.E, c.H);
  for (auto& v : router.data) v = nd(rng) * 0.02f;
  std::vector<uint8_t> rbytes(size_t(c.E) * rld, 0);
  for (int e = 0; e < c.E; ++e) std::memcpy(&rbytes[size_t(e) * rld], router.row(e), size_t(c.H) * 4);
  DevBuf<uint8_t> rdev(rbytes.size());
  rdev.upload(rbytes);
  std::vector<float> bias(size_t(c.E));
  for (auto& b : bias) b = nd(rng) * 0.05f;
  DevBuf<float> bdev(bias.size());
  bdev.upload(bias);

  native::MoeWeights w;
  w.router = native::DenseWeight{rdev.p, DType::F32, c.E, c.H, rld};
  w.router_bias = bdev.p;
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

  ModelSpec spec;
  spec.hidden = c.H;
  spec.num_experts = c.E;
  spec.top_k = c.K;
  spec.routed_scale = 2.0f;
  spec.swiglu_alpha = w.alpha;
  spec.swiglu_limit = w.limit;
  LayerWeights lw;
  lw.router = router;
  lw.router_bias = bias;
  lw.experts.resize(size_t(c.E));
  if (in_slot) lw.shared = expert_weights(w13, w2, c.E);
  if (separate) lw.shared = expert_weights(sw13, sw2, 0);
  std::set<int> have;

  for (int M : c.Ms) {
    const int64_t ldx = (c.H + 3) / 4 * 4, ldo = c.H + 5;
    std::vector<float> x = random_acts(rng, M, c.H, ldx);
    std::vector<float> xc(size_t(M) * c.H);
    for (int t = 0; t < M; ++t) std::memcpy(&xc[size_t(t) * c.H], &x[size_t(t) * ldx], size_t(c.H) * 4);
    // CPU routing, and the tokens whose k-th and (k+1)-th choices are too close to call
    std::vector<float> logits(size_t(M) * c.E);
    ref::linear(router, xc.data(), c.H, M, logits.data(), c.E, pool());
    std::vector<ref::Route> routes;
    std::vector<bool> near_tie(size_t(M), false);
    for (int t = 0; t < M; ++t) {
      routes.push_back(ref::route_token(&logits[size_t(t) * c.E], bias.data(), c.E, c.K, 2.0f));
      if (c.K < c.E) {
        std::vector<double> ch(size_t(c.E));
        for (int e = 0; e < c.E; ++e) ch[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[size_t(t) * c.E + e]))) + bias[size_t(e)];
        std::sort(ch.rbegin(), ch.rend());
        // fp32 logits differ from the reference's by ~1e-6 relative: closer choices may swap
        near_tie[size_t(t)] = ch[size_t(c.K - 1)] - ch[size_t(c.K)] < 1e-5;
      }
      for (int e : routes.back().experts)
        if (!have.count(e)) {
          lw.experts[size_t(e)] = expert_weights(w13, w2, e);
          have.insert(e);
        }
    }
    std::vector<float> ref(size_t(M) * c.H);
    ref::moe_forward(spec, lw, xc.data(), M, ref.data(), pool());

    DevBuf<float> xd(x.size());
    xd.upload(x);
    const size_t wsb = native::moe_workspace_bytes(w, M);
    DevBuf<uint8_t> ws(wsb);
    M3_CUDA_CHECK(cudaMemset(ws.p, 0xff, wsb));  // poison the workspace too
    DevBuf<float> out(size_t(M) * ldo), out2(size_t(M) * ldo);
    out.poison();
    out2.poison();
    native::moe_forward(w, xd.p, ldx, M, out.p, ldo, ws.p, wsb, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    auto view = native::moe_workspace(w, M, ws.p);
    std::vector<int32_t> gids(size_t(M) * c.K);
    std::vector<float> gw(gids.size());
    M3_CUDA_CHECK(cudaMemcpy(gids.data(), view.ids, gids.size() * 4, cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(gw.data(), view.weights, gw.size() * 4, cudaMemcpyDeviceToHost));
    native::moe_forward(w, xd.p, ldx, M, out2.p, ldo, ws.p, wsb, nullptr);
    auto got = out.download(), got2 = out2.download();
    EXPECT_EQ(std::memcmp(got.data(), got2.data(), got.size() * 4), 0) << "two runs differ";
    if (M <= kernels::kMoeDownCombineMaxTokens)
      expect_down_combine_same(w, xd.p, ldx, M, c.H, ws.p, wsb, !separate, rng, got, ldo);

    int ties = 0;
    std::vector<float> g_cmp, r_cmp;
    for (int t = 0; t < M; ++t) {
      if (near_tie[size_t(t)]) {
        ++ties;
        continue;
      }
      for (int k = 0; k < c.K; ++k) {
        EXPECT_EQ(gids[size_t(t) * c.K + k], routes[size_t(t)].experts[size_t(k)]) << "token " << t << " choice " << k;
        EXPECT_NEAR(gw[size_t(t) * c.K + k], routes[size_t(t)].weights[size_t(k)],
                    1e-5 * std::fabs(routes[size_t(t)].weights[size_t(k)]))
            << "token " << t << " choice " << k;
      }
      g_cmp.insert(g_cmp.end(), got.begin() + int64_t(t) * ldo, got.begin() + int64_t(t) * ldo + c.H);
      r_cmp.insert(r_cmp.end(), ref.begin() + int64_t(t) * c.H, ref.begin() + int64_t(t + 1) * c.H);
    }
    EXPECT_LE(ties, std::max(1, M / 8)) << "too many near-ties to be chance";
    double mref = 0;
    for (float v : r_cmp) mref = std::max(mref, double(std::fabs(v)));
    // fp32 sums of ~H and ~I products (relative error ~1e-6 of the terms) against double; any
    // wrong expert, row, weight or scale is an O(1) error
    const int n = int(g_cmp.size() / size_t(c.H));
    expect_close_rows(g_cmp, c.H, r_cmp, n, c.H, 1e-4 * mref, 1e-4,
                      c.name + " M=" + std::to_string(M) + " (" + std::to_string(ties) + " near-tie tokens skipped)");
  }
}

}  // namespace

TEST(GpuMoe, OddShapesSharedInSlot) {
  run_case({"odd E9 k3 H333 I257 shared-in-slot", 9, 3, 333, 257, 257, true, {1, 2, 3, 7, 16, 64}});
}
TEST(GpuMoe, OddShapesSharedOwnWidth) {
  run_case({"odd E9 k3 H333 I257 shared 130", 9, 3, 333, 257, 130, true, {1, 4, 20}});
  run_case({"odd E5 k2 H64 I32 no shared", 5, 2, 64, 32, 0, true, {1, 3}});
}
TEST(GpuMoe, RealShapeTp1) {
  run_case({"real E128 k4 H6144 I3072", 128, 4, 6144, 3072, 3072, false, {1, 3}});
}
TEST(GpuMoe, RealShapeTp4) {
  run_case({"real tp4 E128 k4 H6144 I768", 128, 4, 6144, 768, 768, false, {4, 16}});
}
