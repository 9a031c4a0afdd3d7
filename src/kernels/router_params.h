// Params and work shapes of MoE routing (kernels/router.cuh): top-k selection from router
// logits and the grouping of (token, choice) pairs by expert into entry lists.
#pragma once
#include <cstdint>

#include "kernels/gemv_params.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kRouterMaxExperts = 256;  // experts per lane: 8
constexpr int kRouterMaxTopK = 16;

struct RouterSelectParams {
  const float* logits = nullptr;  // [M][ld]
  int64_t ld = 0;
  const float* bias = nullptr;    // [E]
  int E = 0, K = 0, M = 0;
  float routed_scale = 1.f;
  int32_t* ids = nullptr;         // [M*K]
  float* weights = nullptr;       // [M*K]
};

struct MoeGroupParams {
  const int32_t* ids = nullptr;   // [M*K]
  int M = 0, K = 0, E = 0;
  int shared_slot = 0;            // 1: the shared expert is slot E (an entry after the routed ones)
  int shared_separate = 0;        // 1: the shared expert has its own tensors (sh_* list)
  int32_t* entry_slot = nullptr;  // [E+1]
  int32_t* entry_begin = nullptr; // [E+2]
  int32_t* num_entries = nullptr; // [1]
  int32_t* pair_row = nullptr;    // [M*K + M]
  int32_t* pos_of = nullptr;      // [M*K]
  int32_t* sh_slot = nullptr;     // [1]
  int32_t* sh_begin = nullptr;    // [2]
  int32_t* sh_num = nullptr;      // [1]
};

// select + group in one item (decode-sized batches): the warps select, then the group groups.
struct MoeRouteParams {
  RouterSelectParams select;
  MoeGroupParams group;
};

// The router GEMV whose last item to finish routes (kernels/router_gemv_route.cuh; decode): the
// GEMV's items as GemvOp runs them (one row an item, one token group of at most 4 tokens), each
// adding 1 to `arrivals` when its logits are written; the item that brings it to the item count
// resets it to 0 and runs the route (MoeRouteOp's work, the one-warp grouping) on the GEMV's
// logits. The same logits and lists as the GEMV then the route op, one op less on the chain.
struct RouterGemvRouteParams {
  GemvParams gemv;
  MoeRouteParams route;           // route.select.logits == gemv.y
  int32_t* arrivals = nullptr;    // [1], 0 between launches
};

constexpr int kSelectWarps = 4;      // tokens per select item (one warp each)
constexpr int kGroupThreads = 256;   // threads of the group (and fused route) item
constexpr int kRouteFusedMaxTokens = 64;

M3_HOST_DEVICE inline int moe_group_smem_bytes(int E) { return 2 * (E + 1) * 4; }
// The grouping op (prefill-sized batches): kGroupOpThreads threads; up to kGroupSplitMaxE experts the
// pairs are split over its warps (moe_group_split_work: a histogram per warp, then each warp places
// its own pairs), past that the per-expert scan of moe_group_work.
constexpr int kGroupOpThreads = 1024, kGroupSplitMaxE = 256;
M3_HOST_DEVICE inline int moe_group_op_smem_bytes(int E) {
  return moe_group_smem_bytes(E) + (E <= kGroupSplitMaxE ? (kGroupOpThreads / 32) * E * 4 : 0);
}
M3_HOST_DEVICE inline WorkShape router_select_shape(const RouterSelectParams& p) {
  return {ceil_div(p.M, kSelectWarps), 32 * kSelectWarps, 0};
}
M3_HOST_DEVICE inline WorkShape moe_group_shape(const MoeGroupParams& p) {
  return {1, kGroupOpThreads, moe_group_op_smem_bytes(p.E)};
}
M3_HOST_DEVICE inline WorkShape moe_route_shape(const MoeRouteParams& p) {
  return {1, kGroupThreads, moe_group_smem_bytes(p.group.E) + p.group.M * p.group.K * 4};
}
// The GEMV's items and threads; shared memory for the larger of the two bodies.
M3_HOST_DEVICE inline WorkShape router_gemv_route_shape(const RouterGemvRouteParams& p) {
  const WorkShape g = gemv_shape(p.gemv), r = moe_route_shape(p.route);
  return {g.items, g.threads, g.smem_bytes > r.smem_bytes ? g.smem_bytes : r.smem_bytes};
}
// Where the fusion applies: one row an item, one token group of at most 4 tokens, fp32
// activations, F32 or BF16 weights, at most 32 pairs (the one-warp grouping).
M3_HOST_DEVICE inline bool router_gemv_route_fits(const GemvParams& g, const MoeRouteParams& r) {
  return g.rows == 1 && g.token_groups == 1 && g.mt <= 4 && g.M == r.select.M && g.xfmt == ActFmt::F32 &&
         (g.wfmt == WeightFmt::F32 || g.wfmt == WeightFmt::BF16) && !g.swiglu && g.N == r.select.E &&
         r.select.M * r.select.K <= 32 && r.group.M == r.select.M && r.group.K == r.select.K &&
         r.group.E == r.select.E && r.select.logits == g.y && r.select.ld == g.ld_y;
}

}  // namespace m3::kernels
