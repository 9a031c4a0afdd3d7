// embed launcher: one 256-thread block per token.
#include "kernels/embedding.cuh"
#include "native/cuda_check.h"
#include "native/embed.h"

namespace m3::native {

namespace {
__global__ void __launch_bounds__(256) embed_kernel(kernels::EmbedParams p) {
  kernels::embed_work(p, blockIdx.x, threadIdx.x, 256);
}
}  // namespace

void embed(const EmbedArgs& a, cudaStream_t stream) {
  M3_CHECK(a.table && a.ids && a.V > 0 && a.H > 0 && a.M > 0 && a.ld >= a.H, "embed: bad arguments (V {}, H {}, M {})",
           a.V, a.H, a.M);
  M3_CHECK(a.out || a.out_bf16, "embed: no output");
  M3_CHECK((!a.out || a.ld_out >= a.H) && (!a.out_bf16 || a.ld_ob >= a.H), "embed: output ld smaller than H {}", a.H);
  kernels::EmbedParams p;
  p.table = a.table;
  p.ld = a.ld;
  p.V = a.V;
  p.H = a.H;
  p.M = a.M;
  p.ids = a.ids;
  p.out = a.out;
  p.ld_out = a.ld_out;
  p.out_bf16 = a.out_bf16;
  p.ld_ob = a.ld_ob;
  embed_kernel<<<unsigned(a.M), 256, 0, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
