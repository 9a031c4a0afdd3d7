// Launchers of the routing ops: select (4 tokens per 128-thread item, one warp each), group (one
// 256-thread item over the whole batch), route = both in one item for decode-sized batches (one
// launch and no round trip through a second kernel's start).
#include "kernels/router.cuh"
#include "native/cuda_check.h"
#include "native/launch.cuh"
#include "native/router.h"

namespace m3::native {

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
