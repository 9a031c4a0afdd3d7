// Launchers of the routing ops: select (4 tokens per 128-thread item, one warp each), group (one
// 256-thread item over the whole batch), route = both in one item for decode-sized batches (one
// launch and no round trip through a second kernel's start).
#include "kernels/router.cuh"
#include "kernels/router_gemv_route.cuh"
#include "native/cuda_check.h"
#include "native/env_switch.h"
#include "native/launch.cuh"
#include "native/router.h"

namespace m3::native {

namespace {
EnvSwitch g_route_last("M3_ROUTE_LAST");
}

bool router_gemv_route_enabled() { return g_route_last.on(); }
void set_router_gemv_route(int on) { g_route_last.set(on); }

kernels::RouterGemvRouteParams make_router_gemv_route_params(const kernels::GemvParams& gemv,
                                                             const kernels::MoeRouteParams& route, int32_t* arrivals) {
  M3_CHECK(arrivals, "router_gemv_route: no arrival counter");
  M3_CHECK(kernels::router_gemv_route_fits(gemv, route),
           "router_gemv_route: the router GEMV ({} rows per item, {} token groups of {}, {} tokens) and the route ({} "
           "tokens x top {}, logits {}the GEMV's output) do not fuse",
           gemv.rows, gemv.token_groups, gemv.mt, gemv.M, route.select.M, route.select.K,
           route.select.logits == gemv.y ? "" : "not ");
  return kernels::RouterGemvRouteParams{gemv, route, arrivals};
}

kernels::RouterSelectParams make_router_select_params(const float* logits, int64_t ld, const float* bias, int E, int K,
                                                      int M, float routed_scale, int32_t* ids, float* weights) {
  M3_CHECK(E > 0 && E <= kernels::kRouterMaxExperts && K > 0 && K <= kernels::kRouterMaxTopK && K <= E,
           "router_select: {} experts, top {} unsupported (at most {} experts, top {})", E, K,
           kernels::kRouterMaxExperts, kernels::kRouterMaxTopK);
  M3_CHECK(M > 0 && ld >= E && logits && bias && ids && weights, "router_select: bad arguments (M {}, ld {})", M, ld);
  kernels::RouterSelectParams p;
  p.logits = logits;
  p.ld = ld;
  p.bias = bias;
  p.E = E;
  p.K = K;
  p.M = M;
  p.routed_scale = routed_scale;
  p.ids = ids;
  p.weights = weights;
  return p;
}

kernels::MoeGroupParams make_moe_group_params(const int32_t* ids, int M, int K, int E, bool shared_slot,
                                              bool shared_separate, const MoeGroupBuffers& b) {
  M3_CHECK(M > 0 && K > 0 && E > 0 && E <= 4096 && ids, "moe_group: M {} K {} E {}", M, K, E);
  kernels::MoeGroupParams p;
  p.ids = ids;
  p.M = M;
  p.K = K;
  p.E = E;
  p.shared_slot = shared_slot ? 1 : 0;
  p.shared_separate = shared_separate ? 1 : 0;
  p.entry_slot = b.entry_slot;
  p.entry_begin = b.entry_begin;
  p.num_entries = b.num_entries;
  p.pair_row = b.pair_row;
  p.pos_of = b.pos_of;
  p.sh_slot = b.sh_slot;
  p.sh_begin = b.sh_begin;
  p.sh_num = b.sh_num;
  return p;
}

kernels::MoeRouteParams make_moe_route_params(const kernels::RouterSelectParams& select,
                                              const kernels::MoeGroupParams& group) {
  M3_CHECK(select.M <= kernels::kRouteFusedMaxTokens, "moe_route: {} tokens in the fused route (at most {})", select.M,
           kernels::kRouteFusedMaxTokens);
  M3_CHECK(group.ids == select.ids && group.M == select.M && group.K == select.K && group.E == select.E,
           "moe_route: the grouping does not read the selection's ids ({} x {} of {} experts)", group.M, group.K,
           group.E);
  return kernels::MoeRouteParams{select, group};
}

void launch(const kernels::RouterSelectParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::RouterSelectOp>(p, kernels::router_select_shape(p), stream, "router_select", opt);
}
void launch(const kernels::MoeGroupParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::MoeGroupOp>(p, kernels::moe_group_shape(p), stream, "moe_group", opt);
}
void launch(const kernels::MoeRouteParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::MoeRouteOp>(p, kernels::moe_route_shape(p), stream, "moe_route", opt);
}

void launch(const kernels::RouterGemvRouteParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  using namespace kernels;
  const WorkShape sh = router_gemv_route_shape(p);
  const bool f32 = p.gemv.wfmt == WeightFmt::F32;
  switch (p.gemv.mt) {
    case 1:
      if (f32) launch_op<RouterGemvRouteOp<WeightFmt::F32, 1>>(p, sh, stream, "router_gemv_route", opt);
      else launch_op<RouterGemvRouteOp<WeightFmt::BF16, 1>>(p, sh, stream, "router_gemv_route", opt);
      return;
    case 2:
      if (f32) launch_op<RouterGemvRouteOp<WeightFmt::F32, 2>>(p, sh, stream, "router_gemv_route", opt);
      else launch_op<RouterGemvRouteOp<WeightFmt::BF16, 2>>(p, sh, stream, "router_gemv_route", opt);
      return;
    case 4:
      if (f32) launch_op<RouterGemvRouteOp<WeightFmt::F32, 4>>(p, sh, stream, "router_gemv_route", opt);
      else launch_op<RouterGemvRouteOp<WeightFmt::BF16, 4>>(p, sh, stream, "router_gemv_route", opt);
      return;
    default: M3_FAIL("router_gemv_route: {} tokens a pass", p.gemv.mt);
  }
}

void router_select(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
                   int32_t* ids, float* weights, cudaStream_t stream) {
  launch(make_router_select_params(logits, ld, bias, E, K, M, routed_scale, ids, weights), stream);
}

void moe_group(const int32_t* ids, int M, int K, int E, bool shared_slot, bool shared_separate,
               const MoeGroupBuffers& b, cudaStream_t stream) {
  launch(make_moe_group_params(ids, M, K, E, shared_slot, shared_separate, b), stream);
}

void moe_route(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
               int32_t* ids, float* weights, bool shared_slot, bool shared_separate, const MoeGroupBuffers& b,
               cudaStream_t stream) {
  const auto sp = make_router_select_params(logits, ld, bias, E, K, M, routed_scale, ids, weights);
  const auto gp = make_moe_group_params(ids, M, K, E, shared_slot, shared_separate, b);
  if (M > kernels::kRouteFusedMaxTokens) {
    launch(sp, stream);
    launch(gp, stream);
    return;
  }
  launch(make_moe_route_params(sp, gp), stream);
}

}  // namespace m3::native
