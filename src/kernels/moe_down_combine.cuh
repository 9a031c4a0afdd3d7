// The experts' down projection and the combine in one op for decode (moe_params.h
// MoeDownCombineParams): every item computes its outputs exactly as MoeWideOp does, then counts
// itself in on its row tile's counter; the item that completes a row tile combines the tile's rows
// (shared expert, then the K choices in k order, as moe_combine_work) for every token, one warp a
// token. One op and one dependency hop less on each MoE layer's chain, the same bits.
#pragma once
#include <cstdint>

#include "kernels/arrival.cuh"
#include "kernels/moe_mma.cuh"
#include "kernels/moe_mxfp4.cuh"

namespace m3::kernels {

// S: MoeWideOp's (the staged ring's stages, or 0: the register path). Native only: the mono kernel
// runs the fused op as its two ops (mono/task_table.cpp unfuse_down_combine).
template <int S>
struct MoeDownCombineOp : OpBounds<32 * kMoeMaxChains> {
  using Params = MoeDownCombineParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    MoeWideOp<S>::run(p.down, w, g, smem);  // ends synced, or returned at once on every thread
    constexpr int kRows = 16 * kMoeWideRT;
    static_assert(kRows == 32, "one warp a token covers a row tile");
    const int tile = int(w % moe_row_tiles(p.down));
    if (!arrive_last(p.arrivals + tile, p.down.max_entries, g, reinterpret_cast<int32_t*>(smem))) return;
    for (int t = g.warp(); t < p.combine.M; t += g.num_warps())
      moe_combine_element(p.combine, t, tile * kRows + g.lane(), g.lane());  // no shared memory
  }
};

}  // namespace m3::kernels
