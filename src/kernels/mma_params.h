// Params, chain counts and work shapes of the batch-invariant tensor-core linear layers
// (kernels/mma_linear.cuh) and the sizes both tensor-core kernels (mma_linear, moe_mma) share.
#pragma once
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/fused_norm_params.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kMmaKBlock = 64;     // K elements per block
constexpr int kMmaMaxChains = 16;  // warps per item in the wide mode
// The deep mode (prefill): a CTA of kMmaDeepRowGroups x kMmaDeepTokGroups warps, each a 4 x 4 warp
// tile (64 rows x 32 tokens): CTA tiles of kMmaDeepRows x kMmaDeepTokens.
constexpr int kMmaDeepRowGroups = 4, kMmaDeepTokGroups = 2;
constexpr int kMmaDeepWarps = kMmaDeepRowGroups * kMmaDeepTokGroups;
constexpr int kMmaDeepRows = 64 * kMmaDeepRowGroups, kMmaDeepTokens = 32 * kMmaDeepTokGroups;

struct MmaLinearParams {
  const uint8_t* w = nullptr;      // [N][ld_w bytes]
  const float* w_scale = nullptr;  // [N] (FP8 only)
  int64_t ld_w = 0;
  // MXFP8 only: E8M0 scales [N][ld_mx bytes], byte j of a row scaling its elements 32j .. 32j + 31
  // by 2^(byte - 127); bytes 4 .. 134 only (the walk multiplies exactly in bf16 there: the arena
  // refuses others)
  const uint8_t* w_mx = nullptr;
  int64_t ld_mx = 0;
  const void* x = nullptr;         // [M][ld_x] bf16 or fp32
  int64_t ld_x = 0;
  float* y = nullptr;              // [M][ld_y]
  int64_t ld_y = 0;
  int N = 0, K = 0, M = 0;
  int chains = 1;                  // P (mma_linear_chains)
  int swiglu = 0;                  // 1: interleaved gate/up rows, N even, y has N/2 columns
  float alpha = 1.702f, limit = 7.0f;
  // Launch layout (native::make_mma_linear_params): formats and tiling. Any tiling gives the same
  // bits (the header of mma_linear.cuh); rt x nt tiles of 16 rows x 8 tokens, deep or wide.
  WeightFmt wfmt = WeightFmt::FP8;
  ActFmt xfmt = ActFmt::F32;
  int rt = 1, nt = 1, deep = 0;
  // The decode tile (1 x 1, wide) of FP8 weights only: 0, each warp loads its own weights as it
  // walks (the register walk); 1, each chain's weights are copied whole into shared memory by the
  // copy engine first (kernels/mma_stream.cuh). The same sums either way.
  int stream = 0;
  // FP8 weights only: 1, w in the tiled layout of core/weight_tiles.h (16-row tiles, block-major;
  // ld_w % 64 == 0), else row-major. The same codes, so the same sums and bits.
  int tiled = 0;
  // Fused RMS norms (kernels/fused_norm_params.h; wide mode only): nin.ss set, the activations are
  // a producer's r (1 + w) and every output is multiplied by its token's inv; nout.res set (no
  // SwiGLU, N % 16 == 0), the outputs are not stored in y but added into the residual stream with
  // the next norm's z and chunk sums.
  NormIn nin;
  NormOut nout;
};

// P: enough warps in flight to stream the weights at decode (about 14 per SM over the ceil(N/16)
// row tiles: with more than one CTA per SM, at most 14 warps each), at most kMmaMaxChains and at
// most one chain per block; and at most kMmaMaxChains / ceil(tiles / SMs), so that the tiles fit
// one wave of one 16-warp CTA per SM (the persistent mono kernel's CTA: 160 qkv tiles of 12 chains
// ran in two waves there). Depends on N, K, SMs only.
M3_HOST_DEVICE inline int mma_linear_chains(int N, int K, int sms) {
  const int tiles = (N + 15) / 16, blocks = (K + kMmaKBlock - 1) / kMmaKBlock;
  const int per_sm = (tiles + sms - 1) / sms;
  int p = (sms * 14 + tiles - 1) / tiles;
  p = p < kMmaMaxChains ? p : kMmaMaxChains;
  p = p < kMmaMaxChains / per_sm ? p : kMmaMaxChains / per_sm;
  p = p < blocks ? p : blocks;
  return p < 1 ? 1 : p;
}

// Shared memory of the two walks (kernels/mma_common.cuh): wide, the chain partials of P warps
// (part[P][rt][8 nt columns][17]); deep, each warp's running totals.
// Wide item shared memory: the chain partials, then the fused norm's inv per token.
M3_HOST_DEVICE constexpr int mma_inv_offset_floats(int rt, int nt, int chains) { return chains * rt * 8 * nt * 17; }
M3_HOST_DEVICE constexpr int mma_wide_smem_floats(int rt, int nt, int chains) {
  return mma_inv_offset_floats(rt, nt, chains) + kFusedNormMaxRows;
}
M3_HOST_DEVICE constexpr int mma_deep_smem_floats_per_warp(int rt, int nt) { return rt * nt * 4 * 32; }

// Staged decode tiles (mma_linear.cuh, mma_stage_tile): the 16 weight rows of one row tile of the
// decode op (1 x 1 tiles) copied to shared memory, row r at r * stride. The stride is ld_w rounded
// up to 128 bytes plus 64: the 8 lanes of a quarter warp read rows g and g + 1 at 16-byte offsets
// 16 t (t < 4) of one block, which then fall in 8 distinct 16-byte bank groups. The tile follows
// the chain partials in the group's shared memory, at a 128-byte boundary.
M3_HOST_DEVICE constexpr int64_t mma_staged_stride(int64_t ld_w) { return (ld_w + 127) / 128 * 128 + 64; }
M3_HOST_DEVICE constexpr int64_t mma_staged_tile_bytes(int64_t ld_w) { return 16 * mma_staged_stride(ld_w); }
M3_HOST_DEVICE constexpr int mma_staged_tile_offset(int chains) {
  return (mma_wide_smem_floats(1, 1, chains) * 4 + 127) / 128 * 128;
}

// The streamed decode tile (kernels/mma_stream.cuh): chain j's blocks of the tile's 16 rows sit in
// shared memory region j, row r at r * stride; stride = the longest chain's bytes (L blocks of 64),
// plus 64 when that is a multiple of 128 (so that rows g and g + 1, read by one quarter warp at
// 16-byte offsets 16t, fall in distinct banks). Shared memory: the chain partials (wide mode), P
// mbarriers, then the P regions, each at a 16-byte boundary.
constexpr int kMmaStreamMaxChains = kMmaMaxChains;
M3_HOST_DEVICE inline int mma_stream_steps(int K, int chains) {
  const int blocks = (K + kMmaKBlock - 1) / kMmaKBlock;
  return (blocks + chains - 1) / chains;
}
M3_HOST_DEVICE inline int mma_stream_stride(int K, int chains) {
  const int b = mma_stream_steps(K, chains) * kMmaKBlock;
  return b % 128 == 0 ? b + 64 : b;
}
M3_HOST_DEVICE constexpr int mma_stream_bar_offset(int chains) { return mma_wide_smem_floats(1, 1, chains) * 4; }
M3_HOST_DEVICE constexpr int mma_stream_tile_offset(int chains) {
  return (mma_stream_bar_offset(chains) + chains * 8 + 127) / 128 * 128;
}
M3_HOST_DEVICE inline int mma_stream_smem_bytes(int K, int chains) {
  return mma_stream_tile_offset(chains) + chains * 16 * mma_stream_stride(K, chains);
}

// The norm's halves an op's epilogue handles (kernels/fused_norm_params.h), for the instantiations
// of the decode tile: none, the consumer (p.nin), the producer (p.nout); kNormAny: decided from p.
constexpr int kNormNone = 0, kNormIn = 1, kNormOut = 2, kNormAny = -1;
M3_HOST_DEVICE inline int mma_norm_mode(const MmaLinearParams& p) {
  return p.nout.res ? kNormOut : (p.nin.ss || p.nin.inv) ? kNormIn : kNormNone;
}

M3_HOST_DEVICE inline int mma_row_tiles(const MmaLinearParams& p) { return (p.N + 16 * p.rt - 1) / (16 * p.rt); }

// The deep walk's ring (mma_linear.cuh, mma_linear_deep_work), per stage: one K block of the CTA
// tile's activations ([kMmaDeepTokens][64 elements]), then of its weights ([kMmaDeepRows][64
// elements]); after the ring the warps' running totals.
M3_HOST_DEVICE constexpr int mma_deep_stages(WeightFmt w) { return w == WeightFmt::BF16 ? 3 : 4; }  // E4M3: 4
M3_HOST_DEVICE constexpr int mma_deep_act_bytes(ActFmt x) { return kMmaDeepTokens * kMmaKBlock * (x == ActFmt::F32 ? 4 : 2); }
M3_HOST_DEVICE constexpr int mma_deep_stage_bytes(WeightFmt w, ActFmt x) {
  return mma_deep_act_bytes(x) + kMmaDeepRows * kMmaKBlock * (w == WeightFmt::BF16 ? 2 : 1);
}
M3_HOST_DEVICE constexpr int mma_deep_smem_bytes(WeightFmt w, ActFmt x) {
  return mma_deep_stages(w) * mma_deep_stage_bytes(w, x) + kMmaDeepWarps * mma_deep_smem_floats_per_warp(4, 4) * 4;
}
M3_HOST_DEVICE inline int mma_deep_row_groups(const MmaLinearParams& p) { return (p.N + kMmaDeepRows - 1) / kMmaDeepRows; }
M3_HOST_DEVICE inline int mma_token_tiles(const MmaLinearParams& p) { return (p.M + 8 * p.nt - 1) / (8 * p.nt); }

// Wide: item = (row tile, token tile), row tile fastest; 32 P threads (warp j = chain j).
// Deep: item = CTA tile (row group fastest, then tokens), kMmaDeepWarps warps.
M3_HOST_DEVICE inline WorkShape mma_linear_shape(const MmaLinearParams& p) {
  if (p.deep)
    return {int64_t(mma_deep_row_groups(p)) * ceil_div(p.M, kMmaDeepTokens), 32 * kMmaDeepWarps,
            mma_deep_smem_bytes(p.wfmt, p.xfmt)};
  if (p.stream)
    return {int64_t(mma_row_tiles(p)) * mma_token_tiles(p), 32 * p.chains, mma_stream_smem_bytes(p.K, p.chains)};
  return {int64_t(mma_row_tiles(p)) * mma_token_tiles(p), 32 * p.chains,
          mma_wide_smem_floats(p.rt, p.nt, p.chains) * 4};
}

}  // namespace m3::kernels
