// MoE routing (kernels/router.cuh): top-k selection from router logits, and the grouping of
// (token, choice) pairs by expert into the entry lists the expert kernels read. The router logits
// themselves are a GEMV over the router weight (native/linear.h).
#pragma once
#include <cstdint>

#include "kernels/router_params.h"
#include "native/launch.h"

namespace m3::native {

struct MoeGroupBuffers {   // device arrays (see kernels/router.cuh for their contents)
  int32_t* entry_slot = nullptr;   // [E+1]
  int32_t* entry_begin = nullptr;  // [E+2]
  int32_t* num_entries = nullptr;  // [1]
  int32_t* pair_row = nullptr;     // [M*K + M]
  int32_t* pos_of = nullptr;       // [M*K]
  int32_t* sh_slot = nullptr;      // [1]   (shared expert in its own tensors)
  int32_t* sh_begin = nullptr;     // [2]
  int32_t* sh_num = nullptr;       // [1]
};

// ids / weights [M*K]: the K experts of each token, best first, and their combine weights
// (sigmoid renormalized over the chosen ones, times routed_scale). E <= 256, K <= 16.
kernels::RouterSelectParams make_router_select_params(const float* logits, int64_t ld, const float* bias, int E, int K,
                                                      int M, float routed_scale, int32_t* ids, float* weights);
// shared_slot: the shared expert is slot E (gets an entry after the routed ones);
// shared_separate: it has its own tensors (gets the sh_* list).
kernels::MoeGroupParams make_moe_group_params(const int32_t* ids, int M, int K, int E, bool shared_slot,
                                              bool shared_separate, const MoeGroupBuffers& out);
// select then group in one item of one CTA when M <= kernels::kRouteFusedMaxTokens (decode).
kernels::MoeRouteParams make_moe_route_params(const kernels::RouterSelectParams& select,
                                              const kernels::MoeGroupParams& group);

// The router GEMV whose last item routes (kernels/router_gemv_route.cuh) where
// router_gemv_route_enabled() and kernels::router_gemv_route_fits; arrivals: one int, 0 (the
// backend's, zeroed once; the last item of each launch resets it).
kernels::RouterGemvRouteParams make_router_gemv_route_params(const kernels::GemvParams& gemv,
                                                             const kernels::MoeRouteParams& route, int32_t* arrivals);
// Whether decode-sized MoE plans fuse the route into the router GEMV: on unless M3_ROUTE_LAST=0
// (the same bits either way). set_router_gemv_route overrides it for the plans built from now on
// (0 off, 1 on, -1 back to the environment's).
bool router_gemv_route_enabled();
void set_router_gemv_route(int on);

void launch(const kernels::RouterSelectParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeGroupParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::MoeRouteParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch(const kernels::RouterGemvRouteParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

// make + launch: select; group; route (select + group: fused for M <= kRouteFusedMaxTokens, else
// the two).
void router_select(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
                   int32_t* ids, float* weights, cudaStream_t stream);
void moe_group(const int32_t* ids, int M, int K, int E, bool shared_slot, bool shared_separate,
               const MoeGroupBuffers& out, cudaStream_t stream);
void moe_route(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
               int32_t* ids, float* weights, bool shared_slot, bool shared_separate, const MoeGroupBuffers& out,
               cudaStream_t stream);
using kernels::kRouteFusedMaxTokens;

}  // namespace m3::native
