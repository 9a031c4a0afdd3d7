// Launchers of the routing kernels: router_select maps 4 tokens to a 128-thread block (one warp
// each); moe_group runs one block over the whole batch.
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

}  // namespace

void router_select(const float* logits, int64_t ld, const float* bias, int E, int K, int M, float routed_scale,
                   int32_t* ids, float* weights, cudaStream_t stream) {
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
  router_select_kernel<<<unsigned((M + 3) / 4), 128, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

void moe_group(const int32_t* ids, int M, int K, int E, bool shared_slot, bool shared_separate,
               const MoeGroupBuffers& b, cudaStream_t stream) {
  M3_CHECK(M > 0 && K > 0 && E > 0 && E <= 4096, "moe_group: M {} K {} E {}", M, K, E);
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
  moe_group_kernel<<<1, kGroupThreads, size_t(2 * (E + 1)) * sizeof(int32_t), stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
