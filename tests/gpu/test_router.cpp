// MoE routing on the GPU (native/router.h): top-k selection equals ref::route_token on the same
// fp32 logits (ties to the lower expert id, the bias only choosing), the grouping of pairs by
// expert is a stable sort whose entry lists, pair rows and inverse positions agree, and the
// one-launch moe_route gives bitwise what router_select + moe_group give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "native/linear.h"
#include "native/router.h"
#include "ref/moe.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

TEST(GpuRouter, SelectMatchesReference) {
  const uint32_t seed = gpu_test_seed() + 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  struct C {
    int E, K, M;
  };
  for (const C& c : {C{128, 4, 37}, C{256, 8, 5}, C{9, 3, 64}, C{1, 1, 3}, C{33, 16, 4}}) {
    const int64_t ld = c.E + 3;
    std::vector<float> logits(size_t(c.M) * ld, 0.f), bias(size_t(c.E));
    for (auto& v : logits) v = nd(rng) * 2.f;
    for (auto& b : bias) b = nd(rng) * 0.05f;
    // planted ties: token 0 all equal (choices 0..K-1), token 1 two experts with equal choice
    for (int e = 0; e < c.E; ++e) logits[size_t(e)] = 0.5f;
    std::vector<float> bias0 = bias;
    if (c.M > 1 && c.E > 5) {
      logits[size_t(ld) + 5] = logits[size_t(ld) + 3] = 9.f;
    }
    DevBuf<float> dl(logits.size()), db(bias.size()), dw(size_t(c.M) * c.K);
    DevBuf<int32_t> di(size_t(c.M) * c.K);
    dl.upload(logits);
    // token 0's ties need equal choices: equal logits and equal bias
    std::vector<float> b_eq = bias;
    std::fill(b_eq.begin(), b_eq.end(), 0.01f);
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<float>& bb = pass == 0 ? b_eq : bias0;
      db.upload(bb);
      dw.poison();
      M3_CUDA_CHECK(cudaMemset(di.p, 0xff, di.n * 4));
      native::router_select(dl.p, ld, db.p, c.E, c.K, c.M, 2.0f, di.p, dw.p, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      auto ids = di.download();
      auto w = dw.download();
      for (int t = 0; t < c.M; ++t) {
        ref::Route r = ref::route_token(&logits[size_t(t) * ld], bb.data(), c.E, c.K, 2.0f);
        for (int k = 0; k < c.K; ++k) {
          ASSERT_EQ(ids[size_t(t) * c.K + k], r.experts[size_t(k)])
              << "E " << c.E << " K " << c.K << " token " << t << " choice " << k << " pass " << pass;
          // both compute in double from the same fp32 logits; exp() may differ in the last bit
          ASSERT_NEAR(w[size_t(t) * c.K + k], r.weights[size_t(k)], 2e-7 * std::fabs(r.weights[size_t(k)]) + 1e-30)
              << "token " << t << " choice " << k;
        }
      }
      if (pass == 0) {
        for (int k = 0; k < c.K; ++k) {
          EXPECT_EQ(ids[size_t(k)], k) << "all-equal token: lower ids first";
        }
      }
      if (pass == 0 && c.M > 1 && c.E > 5) {
        EXPECT_EQ(ids[size_t(c.K)], 3) << "tie between experts 3 and 5 goes to 3";
        if (c.K > 1) {
          EXPECT_EQ(ids[size_t(c.K) + 1], 5);
        }
      }
    }
  }
}

TEST(GpuRouter, GroupIsAStableSortByExpert) {
  const uint32_t seed = gpu_test_seed() + 12;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct C {
    int E, K, M;
    bool slot, sep;
  };
  // (E <= kernels::kGroupSplitMaxE: the pairs split over the warps, prefill-sized M included; past it
  // the per-expert scan)
  for (const C& c : {C{128, 4, 1, true, false}, C{128, 4, 300, true, false}, C{9, 3, 50, false, true},
                     C{16, 2, 7, false, false}, C{200, 8, 20, true, false}, C{4096, 16, 70, false, true},
                     C{128, 4, 8192, true, false}, C{kernels::kGroupSplitMaxE, 8, 3001, false, true},
                     C{kernels::kGroupSplitMaxE + 1, 2, 999, true, false}, C{5, 1, 20000, false, false}}) {
    const int MK = c.M * c.K;
    std::vector<int32_t> ids(static_cast<size_t>(MK));
    for (int t = 0; t < c.M; ++t) {  // K distinct experts per token, skewed toward low ids
      std::vector<int> all(size_t(c.E));
      for (int e = 0; e < c.E; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.begin() + std::min(c.E, 3 * c.K), rng);
      for (int k = 0; k < c.K; ++k) ids[size_t(t) * c.K + k] = all[size_t(k)];
    }
    DevBuf<int32_t> di(ids.size()), es(size_t(c.E) + 1), eb(size_t(c.E) + 2), ne(1), pr(size_t(MK + c.M)),
        po(static_cast<size_t>(MK)), ss(1), sb(2), sn(1);
    di.upload(ids);
    for (auto* b : {&es, &eb, &ne, &pr, &po, &ss, &sb, &sn}) M3_CUDA_CHECK(cudaMemset(b->p, 0xff, b->n * 4));
    native::MoeGroupBuffers gb{es.p, eb.p, ne.p, pr.p, po.p, ss.p, sb.p, sn.p};
    native::moe_group(di.p, c.M, c.K, c.E, c.slot, c.sep, gb, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    auto slot = es.download(), begin = eb.download(), num = ne.download(), row = pr.download(), pos = po.download();
    // expected: stable sort of pair indices by expert
    std::vector<int> order(static_cast<size_t>(MK));
    for (int i = 0; i < MK; ++i) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ids[size_t(a)] < ids[size_t(b)]; });
    for (int p = 0; p < MK; ++p) {
      ASSERT_EQ(row[size_t(p)], order[size_t(p)] / c.K) << "pair " << p;
      ASSERT_EQ(pos[size_t(order[size_t(p)])], p) << "pos_of " << order[size_t(p)];
    }
    std::set<int> distinct(ids.begin(), ids.end());
    const int want = int(distinct.size()) + (c.slot ? 1 : 0);
    ASSERT_EQ(num[0], want);
    int a = 0;
    for (int e : distinct) {
      EXPECT_EQ(slot[size_t(a)], e);
      EXPECT_EQ(ids[size_t(order[size_t(begin[size_t(a)])])], e);
      EXPECT_EQ(begin[size_t(a) + 1] - begin[size_t(a)], std::count(ids.begin(), ids.end(), e));
      ++a;
    }
    if (c.slot) {
      EXPECT_EQ(slot[size_t(a)], c.E);
      EXPECT_EQ(begin[size_t(a)], MK);
      EXPECT_EQ(begin[size_t(a) + 1], MK + c.M);
    }
    for (int t = 0; t < c.M; ++t) EXPECT_EQ(row[size_t(MK + t)], t);
    if (c.sep) {
      auto s0 = ss.download(), s1 = sb.download(), s2 = sn.download();
      EXPECT_EQ(s0[0], 0);
      EXPECT_EQ(s1[0], MK);
      EXPECT_EQ(s1[1], MK + c.M);
      EXPECT_EQ(s2[0], 1);
    }
  }
}

namespace {

// The route's outputs of one run (ids, weights, lists), poisoned with its own byte so that a value
// neither of two runs wrote cannot compare equal.
struct RouteOut {
  int E, K, M, MK;
  bool sep;
  DevBuf<int32_t> ids, es, eb, ne, pr, po, ss, sb, sn;
  DevBuf<float> w;
  RouteOut(int E_, int K_, int M_, bool sep_)
      : E(E_), K(K_), M(M_), MK(M_ * K_), sep(sep_), ids(size_t(MK)), es(size_t(E) + 1), eb(size_t(E) + 2), ne(1),
        pr(size_t(MK + M)), po(size_t(MK)), ss(1), sb(2), sn(1), w(size_t(MK)) {}
  native::MoeGroupBuffers gb() { return {es.p, eb.p, ne.p, pr.p, po.p, ss.p, sb.p, sn.p}; }
  std::vector<DevBuf<int32_t>*> ints() { return {&ids, &es, &eb, &ne, &pr, &po, &ss, &sb, &sn}; }
  void poison(uint8_t byte) {
    for (auto* x : ints()) M3_CUDA_CHECK(cudaMemset(x->p, byte, x->n * 4));
    M3_CUDA_CHECK(cudaMemset(w.p, byte, w.n * 4));
  }
};

// Everything both runs must have written, bitwise: ids, weights (finite), pair rows and positions,
// the entries and their entries + 1 begins, the separate shared expert's list.
void expect_same_route(RouteOut& a, RouteOut& b, const std::string& where) {
  const int entries = a.ne.download()[0];
  ASSERT_GT(entries, 0) << where;
  const char* names[] = {"ids", "entry_slot", "entry_begin", "num_entries", "pair_row", "pos_of", "sh_slot", "sh_begin", "sh_num"};
  const size_t used[] = {size_t(a.MK), size_t(entries), size_t(entries) + 1, 1, size_t(a.MK + a.M), size_t(a.MK),
                         a.sep ? 1u : 0u, a.sep ? 2u : 0u, a.sep ? 1u : 0u};
  auto ai = a.ints(), bi = b.ints();
  for (size_t k = 0; k < ai.size(); ++k) {
    const auto x = ai[k]->download(), y = bi[k]->download();
    for (size_t i = 0; i < used[k]; ++i) ASSERT_EQ(x[i], y[i]) << names[k] << "[" << i << "] " << where;
  }
  const auto wa = a.w.download(), wb = b.w.download();
  for (int i = 0; i < a.MK; ++i) {
    ASSERT_TRUE(std::isfinite(wa[size_t(i)])) << "weight " << i << " " << where;
    ASSERT_EQ(std::memcmp(&wa[size_t(i)], &wb[size_t(i)], 4), 0) << "weight " << i << " " << where;
  }
}

}  // namespace

TEST(GpuRouter, FusedRouteEqualsSelectThenGroup) {
  const uint32_t seed = gpu_test_seed() + 13;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  struct C {
    int E, K, M;
    bool slot, sep;
  };
  // M up to kRouteFusedMaxTokens takes the one-block kernel (its grouping by one warp up to 32
  // pairs: M K = 4, 8, 32, 32 with many shared experts; the per-expert scan above), above it the
  // two kernels
  for (const C& c : {C{128, 4, 1, true, false}, C{128, 4, 2, false, true}, C{128, 4, 8, true, false},
                     C{33, 16, 2, false, true}, C{128, 4, 16, false, true},
                     C{128, 4, native::kRouteFusedMaxTokens, true, false},
                     C{128, 4, native::kRouteFusedMaxTokens + 1, true, false}, C{200, 8, 9, false, false},
                     C{33, 16, 3, true, false}, C{256, 8, 64, false, true}}) {
    const int64_t ld = c.E + 1;
    std::vector<float> logits(size_t(c.M) * size_t(ld)), bias(size_t(c.E));
    for (auto& v : logits) v = nd(rng) * 2.f;
    for (auto& b : bias) b = nd(rng) * 0.05f;
    DevBuf<float> dl(logits.size()), db(bias.size());
    dl.upload(logits);
    db.upload(bias);
    RouteOut a(c.E, c.K, c.M, c.sep), b(c.E, c.K, c.M, c.sep);
    a.poison(0xff);
    b.poison(0xfe);
    native::router_select(dl.p, ld, db.p, c.E, c.K, c.M, 2.5f, a.ids.p, a.w.p, nullptr);
    native::moe_group(a.ids.p, c.M, c.K, c.E, c.slot, c.sep, a.gb(), nullptr);
    native::moe_route(dl.p, ld, db.p, c.E, c.K, c.M, 2.5f, b.ids.p, b.w.p, c.slot, c.sep, b.gb(), nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_route(a, b, "E " + std::to_string(c.E) + " K " + std::to_string(c.K) + " M " + std::to_string(c.M));
  }
}

// The router GEMV whose last item routes (kernels/router_gemv_route.cuh) against the GEMV then the
// route: bitwise the same logits, ids, weights and lists, at 1-4 tokens (1, 2, 4 per pass), F32
// and BF16 weights, with and without the shared expert's slot, at most 32 pairs; the arrival
// counter back at 0 after every launch, so five launches in a row (new activations each) agree.
TEST(GpuRouter, RouterThatRoutesEqualsGemvThenRoute) {
  const uint32_t seed = gpu_test_seed() + 17;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  struct C {
    int E, K, M, H;
    DType wt;
    bool slot, sep;
  };
  for (const C& c : {C{128, 4, 1, 6144, DType::F32, true, false}, C{128, 4, 2, 6144, DType::BF16, false, true},
                     C{128, 4, 3, 1000, DType::F32, false, false}, C{128, 4, 4, 6144, DType::F32, true, false},
                     C{33, 8, 4, 520, DType::BF16, true, false}, C{64, 8, 4, 256, DType::F32, false, true}}) {
    SCOPED_TRACE("E " + std::to_string(c.E) + " K " + std::to_string(c.K) + " M " + std::to_string(c.M) + " H " +
                 std::to_string(c.H));
    const int esz = c.wt == DType::F32 ? 4 : 2;
    const int64_t ldw = (int64_t(c.H) * esz + 15) / 16 * 16;  // bytes
    std::vector<uint8_t> w(size_t(c.E) * size_t(ldw), 0);
    for (int e = 0; e < c.E; ++e)
      for (int k = 0; k < c.H; ++k) {
        const float v = nd(rng) * 0.05f;
        if (c.wt == DType::F32) std::memcpy(&w[size_t(e) * ldw + size_t(k) * 4], &v, 4);
        else {
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(&w[size_t(e) * ldw + size_t(k) * 2], &h, 2);
        }
      }
    std::vector<float> bias(size_t(c.E));
    for (auto& b : bias) b = nd(rng) * 0.05f;
    const int64_t ldx = (c.H + 3) / 4 * 4;
    DevBuf<uint8_t> dw(w.size());
    DevBuf<float> db(bias.size()), dx(size_t(c.M) * size_t(ldx));
    dw.upload(w);
    db.upload(bias);
    DevBuf<int32_t> arrivals(4);
    M3_CUDA_CHECK(cudaMemset(arrivals.p, 0, 16));
    RouteOut a(c.E, c.K, c.M, c.sep), b(c.E, c.K, c.M, c.sep);
    DevBuf<float> la_d(size_t(c.M) * size_t(c.E)), lb_d(size_t(c.M) * size_t(c.E));
    auto plan = [&](RouteOut& o, DevBuf<float>& logits) {
      const auto g = native::make_gemv_params(dw.p, c.wt, nullptr, ldw, c.E, c.H, native::ActIn{dx.p, DType::F32, ldx},
                                              c.M, logits.p, c.E, false, 0, 0);
      const auto sp = native::make_router_select_params(logits.p, c.E, db.p, c.E, c.K, c.M, 2.5f, o.ids.p, o.w.p);
      const auto gp = native::make_moe_group_params(o.ids.p, c.M, c.K, c.E, c.slot, c.sep, o.gb());
      return std::pair{g, native::make_moe_route_params(sp, gp)};
    };
    const auto [ga, ra] = plan(a, la_d);
    const auto [gb, rb] = plan(b, lb_d);
    ASSERT_TRUE(kernels::router_gemv_route_fits(gb, rb)) << "rows " << gb.rows << " mt " << gb.mt;
    const auto fused = native::make_router_gemv_route_params(gb, rb, arrivals.p);
    for (int round = 0; round < 5; ++round) {
      std::vector<float> x(size_t(c.M) * size_t(ldx), 0.f);
      for (int t = 0; t < c.M; ++t)
        for (int k = 0; k < c.H; ++k) x[size_t(t) * size_t(ldx) + size_t(k)] = nd(rng);
      dx.upload(x);
      a.poison(0xff);
      b.poison(0xfe);
      la_d.poison();
      M3_CUDA_CHECK(cudaMemset(lb_d.p, 0x7f, lb_d.n * 4));
      native::launch(ga, nullptr);
      native::launch(ra, nullptr);
      native::launch(fused, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(arrivals.download()[0], 0) << "round " << round << ": the arrival counter was not reset";
      const auto la = la_d.download(), lb = lb_d.download();
      for (size_t i = 0; i < la.size(); ++i)
        ASSERT_EQ(std::memcmp(&la[i], &lb[i], 4), 0) << "round " << round << " logit " << i << ": " << la[i] << " vs " << lb[i];
      expect_same_route(a, b, "round " + std::to_string(round));
    }
  }
}
