// Launchers of the routing kernels: router_select maps 4 tokens to a 128-thread block (one warp
// each); moe_group runs one block over the whole batch; moe_route does both in one block for
// decode-sized batches (one launch and no round trip through a second kernel's start).
#include "kernels/router.cuh"
#include "native/cuda_check.h"
#include "native/router.h"

namespace m3::native {

namespace {

__global__ void __launch_bounds__(128) router_select_kernel(kernels::RouterSelectParams p) {
  const int t = blockIdx.x * 4 + threadIdx.x / 32;
  if (t < p.M) kernels::router_select_work(p, t, threadIdx.x & 31);
}

constexpr int kGroupThreads = 256;

__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(kernels::MoeGroupParams p) {
  extern __shared__ int32_t smem[];
  kernels::moe_group_work(p, threadIdx.x, kGroupThreads, smem);
}

// One block: its warps select the tokens (warp w: tokens w, w + 8, ...), then group them. The
// selections reach the grouping through global memory (gp.ids = sp.ids) after the barrier.
__global__ void __launch_bounds__(kGroupThreads) moe_route_kernel(kernels::RouterSelectParams sp,
                                                                  kernels::MoeGroupParams gp) {
  extern __shared__ int32_t smem[];
  for (int t = int(threadIdx.x) / 32; t < sp.M; t += kGroupThreads / 32)
    kernels::router_select_work(sp, t, int(threadIdx.x) & 31);
  __syncthreads();
  kernels::moe_group_work(gp, threadIdx.x, kGroupThreads, smem);
}

kernels::RouterSelectParams select_params(const float* logits, int64_t ld, const float* bias, int E, int K, int M,
                                          float routed_scale, int32_t* ids, float* weights) {
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

kernels::MoeGroupParams group_params(const int32_t* ids, int M, int K, int E, bool shared_slot, bool shared_separate,
                                     const MoeGroupBuffers& b) {
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

size_t group_smem(int E) { return size_t(2 * (E + 1)) * sizeof(int32_t); }

}  // namespace

void router_select(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
                   int32_t* ids, float* weights, cudaStream_t stream) {
  const auto p = select_params(logits, ld, bias, E, K, M, routed_scale, ids, weights);
  router_select_kernel<<<unsigned((M + 3) / 4), 128, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

void moe_group(const int32_t* ids, int M, int K, int E, bool shared_slot, bool shared_separate,
               const MoeGroupBuffers& b, cudaStream_t stream) {
  const auto p = group_params(ids, M, K, E, shared_slot, shared_separate, b);
  moe_group_kernel<<<1, kGroupThreads, group_smem(E), stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

void moe_route(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
               int32_t* ids, float* weights, bool shared_slot, bool shared_separate, const MoeGroupBuffers& b,
               cudaStream_t stream) {
  if (M > kRouteFusedMaxTokens) {
    router_select(logits, ld, bias, E, K, M, routed_scale, ids, weights, stream);
    moe_group(ids, M, K, E, shared_slot, shared_separate, b, stream);
    return;
  }
  const auto sp = select_params(logits, ld, bias, E, K, M, routed_scale, ids, weights);
  const auto gp = group_params(ids, M, K, E, shared_slot, shared_separate, b);
  moe_route_kernel<<<1, kGroupThreads, group_smem(E), stream>>>(sp, gp);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
