// The decode tile of the FP8 linear layer (mma_linear.cuh, wide mode, 1 x 1: 16 weight rows x 8
// tokens, warp j = chain j) with its weights streamed: each warp first has the copy engine bring its
// chain's blocks of the 16 rows into shared memory (cp.async.bulk, one copy per row, completion on
// the warp's mbarrier), loads its token's activations while they land, and then walks its blocks
// from shared memory two at a time. The register walk (mma::chain_sum) lets each warp load its next
// three blocks itself, so its loads and its MMAs take turns and ~3 KB per warp are in flight; here a
// whole tile (~100 KB for the TP-4 qkv) is in flight from the item's first instructions.
// (A producer warp of 16-byte cp.async copies into a ring was tried first, 2026-12-03: the copies of
// one warp streamed at ~10 GB/s per SM, half the register walk's speed.)
//
// Same blocks, chains and sums as mma_linear_wide_work<FP8, X, 1, 1> (the invariance contract of
// mma_linear.cuh): chain j walks blocks chain_begin(j) .. chain_begin(j + 1) - 1 in order, each
// block's 4 steps from +0 in the MMA (hi, then lo for fp32 x), the chain sum +0 + block + block + ...
// in block order, the row total over the chains in chain order (wide_epilogue). The operands are the
// bytes a lane would have loaded (zero for rows past N and for 16-byte runs starting past K) and the
// same activations, so the bits are the same. Two blocks' MMAs interleave (each accumulates into its
// own fragment from +0, as alone) and are added to the chain one after the other.
// Tiled weights (core/weight_tiles.h): the chain's blocks of the tile are one range, one copy, kept
// in shared memory as stored. Shared memory (mma_params.h): partials, P mbarriers (initialized at the item's start, invalidated
// at its end: the group's shared memory is reused by other work), the P chain regions.
#pragma once
#include <cstdint>

#include "kernels/bulk_copy.cuh"
#include "kernels/mma_linear.cuh"

namespace m3::kernels {

// Brings the 128-byte line holding p into L1 (no register, no wait).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

template <ActFmt X>
__device__ __forceinline__ void mma_stream_item(const MmaLinearParams& p, int64_t w, Group g, uint8_t* smem) {
  using namespace mma;
  const int tiles_n = mma_row_tiles(p);
  const int n0 = int(w % tiles_n) * 16, t0 = int(w / tiles_n) * 8;
  const int P = p.chains, K = p.K;
  const int blocks = (K + kMmaKBlock - 1) / kMmaKBlock;
  const int stride = mma_stream_stride(K, P);
  float* part = reinterpret_cast<float*>(smem);
  const int lane = g.lane(), warp = g.warp();
  const int gq = lane >> 2, t = lane & 3;
  const EarlyScale<WeightFmt::FP8, 1, 1> scale(p, n0, g);
  norm_inv_rows(p.nin, g, part + mma_inv_offset_floats(1, 1, P));

  if (warp < P) {
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + mma_stream_bar_offset(P)) + warp;
    uint8_t* region = smem + mma_stream_tile_offset(P) + warp * 16 * stride;
    const int blo = chain_begin(warp, blocks, P), bhi = chain_begin(warp + 1, blocks, P);
    const int rows = min(16, p.N - n0);
    // the chain's bytes of each row: its blocks, cut at the end of the stored row; tiled, the
    // chain's blocks of the tile are one contiguous range (block b of the tile at b * 1024)
    const int64_t first = int64_t(blo) * kMmaKBlock;
    const uint32_t bytes = uint32_t(min(int64_t(bhi) * kMmaKBlock, p.ld_w) - first);
    const int copies = p.tiled ? 1 : rows;
    const uint32_t copy_bytes = p.tiled ? kTileRows * bytes : bytes;
    if (lane == 0) {
      mbar_init(bar, 1);
      mbar_init_fence();
      mbar_expect_tx(bar, uint32_t(copies) * copy_bytes);
    }
    __syncwarp();
    if (lane < copies) {
      proxy_fence_shared();  // earlier generic accesses of this memory before the copy's writes
      const uint8_t* src = p.tiled ? p.w + int64_t(n0) * p.ld_w + int64_t(blo) * kTileBlockStride
                                   : p.w + int64_t(n0 + lane) * p.ld_w + first;
      bulk_g2s(region + lane * stride, src, copy_bytes, bar);
    }

    const int tk = t0 + gq;
    const bool tok = tk < p.M;
    const uint8_t* xrow = static_cast<const uint8_t*>(p.x) + int64_t(tok ? tk : 0) * p.ld_x * act_bytes(X);
    auto load = [&](int b, ActRaw<X>& r) {
      const int kc = b * kMmaKBlock + 16 * t;
      if ((b + 1) * kMmaKBlock <= K) act_load<X, true>(xrow, tok, kc, K, r);
      else act_load<X, false>(xrow, tok, kc, K, r);
    };
    auto split = [&](int b, const ActRaw<X>& r, uint32_t (&hi)[4][2], uint32_t (&lo)[4][2]) {
      const int kc = b * kMmaKBlock + 16 * t;
      if ((b + 1) * kMmaKBlock <= K) act_split<X, true>(r, kc, K, hi, lo);
      else act_split<X, false>(r, kc, K, hi, lo);
    };
    // rows g and g + 8 of the region, block b at b * bstride (tiled: the region holds the tile's
    // blocks blo .. bhi - 1 as stored, row r of a block at r * 64)
    const bool ok0 = gq < rows, ok1 = gq + 8 < rows;
    const int rstride = p.tiled ? kTileBlockBytes : stride;
    const int bstride = p.tiled ? kTileBlockStride : kMmaKBlock;
    const uint8_t* r0 = region + gq * rstride - int64_t(blo) * bstride + 16 * t;
    const uint8_t* r1 = region + (gq + 8) * rstride - int64_t(blo) * bstride + 16 * t;
    auto wrun = [&](int b, WRun<WeightFmt::FP8>& wr) {
      const int kc = b * kMmaKBlock + 16 * t;
      wr.v[0][0] = ok0 && kc < K ? ld_shared_16(r0 + b * bstride) : make_uint4(0, 0, 0, 0);
      wr.v[1][0] = ok1 && kc < K ? ld_shared_16(r1 + b * bstride) : make_uint4(0, 0, 0, 0);
    };

    float chain[1][1][4];
    zero<1, 1>(chain);
    // the chain's activations into L1 while the weights land (64 bytes per lane and block; the
    // loads below then hit L1 instead of waiting on L2 block by block)
    if (tok)
      for (int b = blo; b < bhi; ++b) prefetch_l1(xrow + int64_t(b * kMmaKBlock + 16 * t) * act_bytes(X));
    mbar_wait(bar, 0);
    for (int b = blo; b < bhi; ++b) {
      WRun<WeightFmt::FP8> wr[1];
      uint32_t bh[4][2], bl[4][2];
      {
        ActRaw<X> r;
        load(b, r);
        wrun(b, wr[0]);
        split(b, r, bh, bl);
      }
      float blk[1][1][4];
      zero<1, 1>(blk);
      block_steps_1tok<WeightFmt::FP8, X, 1>(wr, bh, bl, blk);
      add_into<1, 1>(chain, blk);
    }
    store_partials<1, 1>(chain, warp, lane, part);
  }
  g.sync();
  if (warp < P && lane == 0) mbar_inval(reinterpret_cast<uint64_t*>(smem + mma_stream_bar_offset(P)) + warp);
  linear_epilogue<WeightFmt::FP8, 1, 1, kNormAny>(p, part, n0, t0, g, scale);
  g.sync();  // shared memory is reused by the group's next item (the barriers are invalid by now)
}

template <ActFmt X>
struct MmaStreamOp : OpBounds<kMmaStreamMaxChains * 32, 1> {
  using Params = MmaLinearParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) { mma_stream_item<X>(p, w, g, smem); }
};

}  // namespace m3::kernels
