// Batch-invariant linear layers on tensor cores, any number of tokens M (native/linear.h):
//   plain : y[t, n] = s_n * sum_k W[n, k] x[t, k]          (s_n: FP8 row scale, else 1)
//   swiglu: y[t, j] = swiglu_oai(s_2j * row 2j, s_2j+1 * row 2j+1)   (rows interleaved gate/up)
// W: FP8 E4M3 codes or BF16, [N rows][ld_w bytes] (ld_w % 16 == 0, zero past K); scales [N] fp32;
// x: fp32 or bf16 [M][ld_x] (rows 16-byte aligned); y: fp32 [M][ld_y].
//
// MMA (swap-AB). mma.sync m16n8k16 bf16 x bf16 -> fp32: the MMA's 16 "rows" are 16 weight rows
// (output channels) and its 8 "columns" are 8 tokens. A warp owns 16*RT rows x 8*NT tokens: RT
// row tiles, NT token tiles, RT*NT accumulator fragments, the weight fragments reused by every
// token tile. Lane l: g = l / 4 (row g and g + 8 of a row tile; token g of a token tile),
// t = l % 4.
// Operands in bf16, exactly:
//   - FP8 E4M3 codes: the 7 magnitude bits are placed at bf16 bits 10..4 (exponent low 4 bits,
//     mantissa top 3) and the sign at bit 15, which is the code's value times 2^-120 (normals
//     and subnormals alike, since bf16 has subnormals down to 2^-133); one bf16x2 multiply by
//     2^120 gives the value exactly. Codes 0x7f / 0xff (NaN) would decode to +-480; the
//     prepared store never holds them (the quantizer saturates to 448 and rejects NaN input).
//   - BF16 weights: as they are.
//   - fp32 activations: x = hi + lo with hi = bf16_rn(x), lo = bf16_rn(x - hi) (x - hi is exact
//     in fp32), so |x - hi - lo| <= 2^-18 |x|; both are multiplied (two MMAs, hi first).
//     bf16 activations: hi only (one MMA). fp32 activations handed over split (ActFmt::F32Split,
//     kernels/act_split.cuh: the decode tile only) are these hi and lo as the producer split them.
// K order (free inside a k16 step as long as A and B agree): K is cut into blocks of 64
// elements. In block b, lane t owns the 16 contiguous elements k = 64b + 16t .. +15 of its rows
// (one 16-byte load per row for FP8, two for BF16) and of its token; MMA step s (0..3) of the
// block uses elements 64b + 16t + 4s + {0,1,2,3} as the step's logical columns
// {2t, 2t+1, 2t+8, 2t+9}:  a0 = row g e{0,1}, a1 = row g+8 e{0,1}, a2 = row g e{2,3},
// a3 = row g+8 e{2,3};  b0 = token g e{0,1}, b1 = token g e{2,3}.  (16t + 4s + e over t, s, e
// covers the block once.) Elements at or past K read as zero (weights and activations).
//
// Summation order (the invariance contract). With B = ceil(K / 64) blocks and P chains
// (mma_linear_chains: a function of N, K and the device's SM count ONLY):
//   chain j covers blocks [j*B/P, (j+1)*B/P);
//   block sum  = the block's 4 steps (hi MMA then lo MMA each) accumulated from +0 in the MMA;
//   chain sum  = +0 + block sum + block sum + ... in block order (fp32 adds);
//   row total  = chain 0 + chain 1 + ... + chain P-1 (left to right, fp32 adds);
//   y          = total * s_n (FP8), then the SwiGLU epilogue where asked.
// Every MMA output element depends only on its own row of A and column of B, so a token's result
// depends on its own activations, the weights and (N, K, SMs): never on M, on the other tokens,
// on which token tile or MMA column it lands in, or on the tiling (RT, NT) or the mode below.
// No atomics; no cross-CTA sums.
// Two ways to walk the same chains:
//   wide (decode): one CTA = one tile of 16*RT rows x 8*NT tokens, P warps = the P chains in
//     parallel; the chain sums meet in shared memory and are added in chain order.
//   deep (prefill): one warp = one tile, all P chains one after another; the running total (over
//     chains) is kept in shared memory, the per-chain sum in registers; a CTA of 8 warps covers 256
//     rows x 64 tokens and copies each K block's activations and weights once into a shared-memory
//     ring (mma_linear_deep_work).
// FP8 weights are row-major or (p.tiled, the prepared arena) in the 16-row tiles of
// core/weight_tiles.h: the same codes at other addresses, so the same operands, sums and bits; a
// lane addresses block b of its row as row start + b * block stride + its 16-byte run.
// Decode streams weights with ld.global.nc.L1::no_allocate (16 bytes per lane and row, U blocks
// in flight per warp); activations go through L1 (__ldg), 16 bytes per lane, step and tile. The
// mono kernel may instead stage a decode item's 16 weight rows in shared memory before the item's
// inputs are ready (mma_stage_tile: bulk copies, mbarrier completion) and run it from there
// (mma_linear_staged_item): the same bytes, blocks and sums, so the same bits.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/weight_tiles.h"
#include "kernels/bulk_copy.cuh"
#include "kernels/cp_async.cuh"
#include "kernels/fused_norm.cuh"
#include "kernels/mma_common.cuh"
#include "kernels/mma_params.h"
#include "kernels/swiglu.cuh"
#include "kernels/weight_stream.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

namespace mma {

// The bf16x2 multiplier of E8M0 byte s: {2^(s - 7), 2^(s - 7)} (bf16 exponent field s + 120: exact
// for s <= 134; a larger byte gives +inf, so its outputs are inf / NaN, never silently wrong: the
// arena refuses such scales, kernels/mma_params.h).
__device__ __forceinline__ uint32_t mx_mul(uint32_t s) {
  const uint32_t b = min(s + 120u, 255u) << 7;
  return b | (b << 16);
}

// The A fragment of step s from one 16-element run per row (rows g and g + 8).
template <WeightFmt W>
struct WRun;
template <>
struct WRun<WeightFmt::FP8> {
  static constexpr int kVec = 1;  // uint4 per row and block
  uint4 v[2][1];
  __device__ __forceinline__ void frag(int s, uint32_t (&a)[4]) const {
    const uint32_t w0 = s == 0 ? v[0][0].x : s == 1 ? v[0][0].y : s == 2 ? v[0][0].z : v[0][0].w;
    const uint32_t w8 = s == 0 ? v[1][0].x : s == 1 ? v[1][0].y : s == 2 ? v[1][0].z : v[1][0].w;
    e4m3x4_to_bf16x2(w0, a[0], a[2]);
    e4m3x4_to_bf16x2(w8, a[1], a[3]);
  }
};
// MXFP8: the FP8 run, and the E8M0 bytes of the two rows' blocks for the run's 16 elements (a
// lane's run lies inside one 32-element scale block), packed: row g's in bits 0..15, row g + 8's
// in bits 16..31 (one register a run: the decode tile's walk is short of registers), turned into
// multipliers (mx_mul) when decoded.
template <>
struct WRun<WeightFmt::MXFP8> {
  static constexpr int kVec = 1;
  uint4 v[2][1];
  uint32_t m;
  __device__ __forceinline__ void frag(int s, uint32_t (&a)[4]) const {
    const uint32_t w0 = s == 0 ? v[0][0].x : s == 1 ? v[0][0].y : s == 2 ? v[0][0].z : v[0][0].w;
    const uint32_t w8 = s == 0 ? v[1][0].x : s == 1 ? v[1][0].y : s == 2 ? v[1][0].z : v[1][0].w;
    e4m3x4_to_bf16x2(w0, a[0], a[2], mx_mul(m & 0xffffu));
    e4m3x4_to_bf16x2(w8, a[1], a[3], mx_mul(m >> 16));
  }
};
template <>
struct WRun<WeightFmt::BF16> {
  static constexpr int kVec = 2;
  uint4 v[2][2];
  __device__ __forceinline__ void frag(int s, uint32_t (&a)[4]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4& q = v[h][s >> 1];
      a[h] = (s & 1) ? q.z : q.x;
      a[h + 2] = (s & 1) ? q.w : q.y;
    }
  }
};

// 16 bytes of a staged tile (shared memory).
__device__ __forceinline__ uint4 ld_shared_16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// Weight runs of rows n (h = 0) and n + 8 (h = 1) at element kc of a block, which starts boff bytes
// past each row's start (row[h]); zero past K / N. The rows are in global memory, or (SMEM) in a
// staged tile: the same bytes either way.
template <WeightFmt W, bool SMEM = false>
__device__ __forceinline__ void load_wrun(WRun<W>& r, const uint8_t* const (&row)[2], const bool (&ok)[2],
                                          int boff, int kc, int K) {
  constexpr int es = is_e4m3(W) ? 1 : 2;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < WRun<W>::kVec; ++i) {
      // the row is readable up to round_up(K, 16 / es) elements: run i of 16 / es elements is
      // readable when it starts before K
      const bool in = ok[h] && kc + i * (16 / es) < K;
      const uint8_t* at = row[h] + boff + 16 * i;
      if constexpr (SMEM) r.v[h][i] = in ? ld_shared_16(at) : make_uint4(0, 0, 0, 0);
      else r.v[h][i] = in ? wstream::ld_stream(at) : make_uint4(0, 0, 0, 0);
    }
}

// One token's activations of one block (elements kc .. kc + 15) as loaded: fp32 as four float4
// (zero for a padding token and past K when FULL is false), bf16 as two uint4 (masked past K by
// act_split).
template <ActFmt X>
struct ActRaw;
template <>
struct ActRaw<ActFmt::F32> {
  float4 v[4];
};
template <>
struct ActRaw<ActFmt::BF16> {
  uint4 v[2];
};
template <>
struct ActRaw<ActFmt::F32Split> {
  uint4 v[4];  // step s: {hi e0 e1, hi e2 e3, lo e0 e1, lo e2 e3} (act_split.cuh)
};

// A split group with its elements k + i at or past K zeroed (i = 1 .. 3; k < K).
__device__ __forceinline__ void mask_split_group(uint4& v, int k, int K) {
  if (k + 1 >= K) { v.x &= 0xffffu; v.z &= 0xffffu; }
  if (k + 2 >= K) { v.y = 0; v.w = 0; }
  else if (k + 3 >= K) { v.y &= 0xffffu; v.w &= 0xffffu; }
}

template <ActFmt X, bool FULL>
__device__ __forceinline__ void act_load(const uint8_t* xrow, bool ok, int kc, int K, ActRaw<X>& r) {
  if constexpr (X == ActFmt::F32) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int k = kc + 4 * s;
      r.v[s] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (ok && (FULL || k < K)) r.v[s] = __ldg(reinterpret_cast<const float4*>(xrow) + (k >> 2));
      if constexpr (!FULL) {
        if (k + 1 >= K) r.v[s].y = 0.f;
        if (k + 2 >= K) r.v[s].z = 0.f;
        if (k + 3 >= K) r.v[s].w = 0.f;
      }
    }
  } else if constexpr (X == ActFmt::F32Split) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int k = kc + 4 * s;
      r.v[s] = make_uint4(0, 0, 0, 0);
      if (ok && (FULL || k < K)) r.v[s] = __ldg(reinterpret_cast<const uint4*>(xrow) + (k >> 2));
      if constexpr (!FULL) mask_split_group(r.v[s], k, K);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = kc + 8 * i;
      r.v[i] = make_uint4(0, 0, 0, 0);
      if (ok && (FULL || k < K)) r.v[i] = __ldg(reinterpret_cast<const uint4*>(xrow) + (k >> 3));
    }
  }
}

// The B fragments of step s (elements kc + 4s .. + 3) as hi[s][0..1] (and lo[s][0..1] for fp32 x).
template <ActFmt X, bool FULL>
__device__ __forceinline__ void act_split(const ActRaw<X>& r, int kc, int K, uint32_t (&hi)[4][2],
                                          uint32_t (&lo)[4][2]) {
  if constexpr (X == ActFmt::F32) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      split_hi_lo(r.v[s].x, r.v[s].y, hi[s][0], lo[s][0]);
      split_hi_lo(r.v[s].z, r.v[s].w, hi[s][1], lo[s][1]);
    }
  } else if constexpr (X == ActFmt::F32Split) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      hi[s][0] = r.v[s].x;
      hi[s][1] = r.v[s].y;
      lo[s][0] = r.v[s].z;
      lo[s][1] = r.v[s].w;
    }
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      hi[s][0] = (s & 1) ? r.v[s >> 1].z : r.v[s >> 1].x;
      hi[s][1] = (s & 1) ? r.v[s >> 1].w : r.v[s >> 1].y;
      if constexpr (!FULL) {
        const int k = kc + 4 * s;
        if (k >= K) hi[s][0] = 0;
        else if (k + 1 >= K) hi[s][0] &= 0xffffu;
        if (k + 2 >= K) hi[s][1] = 0;
        else if (k + 3 >= K) hi[s][1] &= 0xffffu;
      }
      lo[s][0] = lo[s][1] = 0;
    }
  }
}

// B fragments of one token for a whole block: elements kc + 4s .. + 3 of step s as hi[s][0..1]
// (and lo[s][0..1] for fp32 x); zero for a padding token (ok false) and past K (FULL false).
template <ActFmt X, bool FULL>
__device__ __forceinline__ void act_run(const uint8_t* xrow, bool ok, int kc, int K, uint32_t (&hi)[4][2],
                                        uint32_t (&lo)[4][2]) {
  ActRaw<X> r;
  act_load<X, FULL>(xrow, ok, kc, K, r);
  act_split<X, FULL>(r, kc, K, hi, lo);
}

// B fragments (hi, lo) of one step for one token: elements k .. k + 3, zero for a padding token and
// past K (FULL false).
template <ActFmt X, bool FULL>
__device__ __forceinline__ void act_step(const uint8_t* xrow, bool ok, int k, int K, uint32_t (&hi)[2],
                                         uint32_t (&lo)[2]) {
  if constexpr (X == ActFmt::F32) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok && (FULL || k < K)) v = __ldg(reinterpret_cast<const float4*>(xrow) + (k >> 2));
    if constexpr (!FULL) {
      if (k + 1 >= K) v.y = 0.f;
      if (k + 2 >= K) v.z = 0.f;
      if (k + 3 >= K) v.w = 0.f;
    }
    split_hi_lo(v.x, v.y, hi[0], lo[0]);
    split_hi_lo(v.z, v.w, hi[1], lo[1]);
  } else if constexpr (X == ActFmt::F32Split) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok && (FULL || k < K)) v = __ldg(reinterpret_cast<const uint4*>(xrow) + (k >> 2));
    if constexpr (!FULL) mask_split_group(v, k, K);
    hi[0] = v.x;
    hi[1] = v.y;
    lo[0] = v.z;
    lo[1] = v.w;
  } else {
    uint2 v = make_uint2(0, 0);
    if (ok && (FULL || k < K)) v = __ldg(reinterpret_cast<const uint2*>(xrow) + (k >> 2));
    if constexpr (!FULL) {
      if (k + 1 >= K) v.x &= 0xffffu;
      if (k + 2 >= K) v.y = 0;
      else if (k + 3 >= K) v.y &= 0xffffu;
    }
    hi[0] = v.x;
    hi[1] = v.y;
    lo[0] = lo[1] = 0;
  }
}

// The lane's weight rows n0 + rt*16 + g + 8h of the weight (tile_rows' contract: rows at or past N
// point at row 0 and are masked) and the bytes between two blocks of a row: 64 elements row-major,
// kTileBlockStride tiled (core/weight_tiles.h).
template <WeightFmt W, int RT>
__device__ __forceinline__ int weight_rows(const MmaLinearParams& p, int n0, int g, const uint8_t* (&row)[RT][2],
                                               bool (&ok)[RT][2]) {
  if constexpr (is_e4m3(W)) {
    if (p.tiled) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = n0 + rt * 16 + g + 8 * h;
          ok[rt][h] = n < p.N;
          row[rt][h] = p.w + tiled_offset(ok[rt][h] ? n : 0, 0, p.ld_w);
        }
      return kTileBlockStride;
    }
  }
  tile_rows<RT>(p.w, p.ld_w, n0, g, p.N, row, ok);
  return kMmaKBlock * (is_e4m3(W) ? 1 : 2);
}

// MXFP8: the block-scale multipliers of the lane's rows (ok: the rows weight_rows found) for the run
// at element kc (scale byte kc / 32 of each row).
template <WeightFmt W, int RT>
__device__ __forceinline__ void load_mx(WRun<W> (&wr)[RT], const MmaLinearParams& p, int n0, int g,
                                        const bool (&ok)[RT][2], int kc) {
  if constexpr (W == WeightFmt::MXFP8) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      wr[rt].m = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + rt * 16 + g + 8 * h;
        // (past K or N the codes read as zero: any scale; none is read there)
        if (ok[rt][h] && kc < p.K) wr[rt].m |= uint32_t(__ldg(p.w_mx + int64_t(n) * p.ld_mx + (kc >> 5))) << (16 * h);
      }
    }
  }
}

// (MXFP8 holds one block fewer than FP8 at RT 1: its runs' scale bytes made the decode tile's walk
// spill at 72 registers with 3, ptxas 2026-12-06, when the tile was held to 72; 2 spills nothing.
// Any U gives the same sums.)
template <WeightFmt W>
constexpr int blocks_in_flight(int rt) {
  if constexpr (W == WeightFmt::MXFP8) return rt >= 4 ? 1 : 2;
  return W == WeightFmt::FP8 ? (rt >= 4 ? 1 : rt == 2 ? 2 : 3) : (rt >= 2 ? 1 : 2);
}

// Blocks per load group of chain_sum_whole (two groups in registers: 108 registers at 1, 2 or 3,
// ptxas 2026-12-07; 2 keeps 4 KB of a warp's weights in flight).
constexpr int kWholeU = 2;

// One token's block: its 4 steps (hi MMA, then lo MMA for fp32 x) into blk (+0 on entry).
template <WeightFmt W, ActFmt X, int RT>
__device__ __forceinline__ void block_steps_1tok(const WRun<W> (&wr)[RT], const uint32_t (&bh)[4][2],
                                                 const uint32_t (&bl)[4][2], float (&blk)[RT][1][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      uint32_t a[4];
      wr[rt].frag(s, a);
      mma_bf16(blk[rt][0], a, bh[s][0], bh[s][1]);
      if constexpr (act_has_lo(X)) mma_bf16(blk[rt][0], a, bl[s][0], bl[s][1]);
    }
}

// Several token tiles: each step's weight fragments decoded once, used by every tile. act(nt, s, bh,
// bl): token tile nt's B fragments of step s as act_step gives them.
template <WeightFmt W, ActFmt X, int RT, int NT, class Act>
__device__ __forceinline__ void block_steps(const WRun<W> (&wr)[RT], Act act, float (&blk)[RT][NT][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t a[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) wr[rt].frag(s, a[rt]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t bh[2], bl[2];
      act(nt, s, bh, bl);
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        mma_bf16(blk[rt][nt], a[rt], bh[0], bh[1]);
        if constexpr (act_has_lo(X)) mma_bf16(blk[rt][nt], a[rt], bl[0], bl[1]);
      }
    }
  }
}

// One block's 4 steps (hi MMA, then lo MMA for fp32 x) from +0 into blk, added to chain.
template <WeightFmt W, ActFmt X, int RT, int NT, bool FULL>
__device__ __forceinline__ void block_mma(const WRun<W> (&wr)[RT], const uint8_t* const (&xrow)[NT],
                                          const bool (&tok)[NT], int kc, int K, float (&chain)[RT][NT][4]) {
  float blk[RT][NT][4];
  zero<RT, NT>(blk);
  if constexpr (NT == 1) {  // decode: the token's whole run first (4 loads in flight), then the steps
    uint32_t bh[4][2], bl[4][2];
    act_run<X, FULL>(xrow[0], tok[0], kc, K, bh, bl);
    block_steps_1tok<W, X, RT>(wr, bh, bl, blk);
  } else {
    block_steps<W, X, RT, NT>(
        wr,
        [&](int nt, int s, uint32_t(&bh)[2], uint32_t(&bl)[2]) {
          act_step<X, FULL>(xrow[nt], tok[nt], kc + 4 * s, K, bh, bl);
        },
        blk);
  }
  add_into<RT, NT>(chain, blk);
}

// One chain: blocks [blo, bhi) of rows n0 .. n0 + 16*RT - 1 and tokens t0 .. t0 + 8*NT - 1;
// chain[rt][nt][i] = +0 + block sum + block sum + ... (the order of the file header).
// staged (RT 1 only): the tile's rows are in shared memory (mma_stage_tile): row-major, row r at
// staged + r * mma_staged_stride(ld_w); tiled, the tile as stored; the same bytes, blocks and sums
// as from global memory.
template <WeightFmt W, ActFmt X, int RT, int NT, bool SMEM = false>
__device__ __forceinline__ void chain_sum(const MmaLinearParams& p, int n0, int t0, int blo, int bhi, int lane,
                                          float (&chain)[RT][NT][4], const uint8_t* staged = nullptr) {
  static_assert(!SMEM || RT == 1, "staged tiles hold one row tile");
  static_assert(!SMEM || W != WeightFmt::MXFP8, "staged tiles are FP8 or BF16");
  constexpr int U = SMEM ? 4 : blocks_in_flight<W>(RT);
  const int g = lane >> 2, t = lane & 3;
  constexpr int es = is_e4m3(W) ? 1 : 2;
  const uint8_t* row[RT][2];
  bool rok[RT][2];
  int bstride;  // bytes between blocks of a row (within a row or a tile: < 2^31)
  if constexpr (SMEM) {
    const int64_t stride = p.tiled ? kTileBlockBytes : mma_staged_stride(p.ld_w);
    bstride = p.tiled ? kTileBlockStride : kMmaKBlock;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rok[0][h] = n0 + g + 8 * h < p.N;
      row[0][h] = staged + (g + 8 * h) * stride;
    }
  } else {
    bstride = weight_rows<W, RT>(p, n0, g, row, rok);
  }
  const uint8_t* xrow[NT];
  bool tok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tk = t0 + nt * 8 + g;
    tok[nt] = tk < p.M;
    xrow[nt] = static_cast<const uint8_t*>(p.x) + int64_t(tok[nt] ? tk : 0) * p.ld_x * act_bytes(X);
  }
  zero<RT, NT>(chain);

  for (int b = blo; b < bhi; b += U) {
    WRun<W> wr[U][RT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kc = (b + u) * kMmaKBlock + 16 * t;
      const bool live = b + u < bhi;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const bool ok[2] = {live && rok[rt][0], live && rok[rt][1]};
        load_wrun<W, SMEM>(wr[u][rt], row[rt], ok, (b + u) * bstride + 16 * t * es, kc, p.K);
      }
      load_mx<W, RT>(wr[u], p, n0, g, rok, kc);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b + u >= bhi) break;  // warp-uniform
      const int kc = (b + u) * kMmaKBlock + 16 * t;
      if ((b + u + 1) * kMmaKBlock <= p.K) block_mma<W, X, RT, NT, true>(wr[u], xrow, tok, kc, p.K, chain);
      else block_mma<W, X, RT, NT, false>(wr[u], xrow, tok, kc, p.K, chain);
    }
  }
}


// chain_sum for a whole decode item of global FP8 or BF16 weights and one token tile (every row of
// the tile < N, K % kMmaKBlock == 0): the same blocks, block sums and chain sum, so the same bits.
// Two groups of U blocks in registers, the next group's weights in flight while this group's are
// multiplied (chain_sum issues a group only after the previous group's MMAs); the row pointers and
// the token's pointer advance once a group, every load at an immediate offset from them; no bounds
// or zero fills, and the padding tokens' columns read a real row (xrow: token t0 + g's row, or
// row 0 for a padding token; the epilogue stores real tokens only).
template <WeightFmt W, ActFmt X, int RT, int U, int NG = 2>
__device__ __forceinline__ void chain_sum_whole(const MmaLinearParams& p, int n0, int blo, int bhi, int lane,
                                                const uint8_t* xrow, float (&chain)[RT][1][4]) {
  static_assert(W == WeightFmt::FP8 || W == WeightFmt::BF16, "whole items: global FP8 / BF16 weights");
  constexpr int es = is_e4m3(W) ? 1 : 2, xb = act_bytes(X);
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* row[RT][2];
  bool rok[RT][2];
  const int bstride = weight_rows<W, RT>(p, n0, g, row, rok);
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) row[rt][h] += int64_t(blo) * bstride + 16 * t * es;
  const uint8_t* xp = xrow + int64_t(blo * kMmaKBlock + 16 * t) * xb;
  zero<RT, 1>(chain);
  if (blo >= bhi) return;
  // blocks b .. b + U - 1 (those before bhi) at the row pointers, which then pass them
  auto load_group = [&](WRun<W>(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u > 0 && b + u >= bhi) break;  // warp-uniform
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < WRun<W>::kVec; ++i)
            wr[u][rt].v[h][i] = wstream::ld_stream(row[rt][h] + u * bstride + 16 * i);
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) row[rt][h] += U * bstride;
  };
  // their MMAs in block order (the token's run of each block read as block_mma reads it), then the
  // token's pointer past them
  auto mma_group = [&](const WRun<W>(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b + u >= bhi) break;  // warp-uniform
      float blk[RT][1][4];
      zero<RT, 1>(blk);
      uint32_t bh[4][2], bl[4][2];
      act_run<X, true>(xp + u * kMmaKBlock * xb, true, 0, p.K, bh, bl);
      block_steps_1tok<W, X, RT>(wr[u], bh, bl, blk);
      add_into<RT, 1>(chain, blk);
    }
    xp += U * kMmaKBlock * xb;
  };
  if constexpr (NG == 2) {
    WRun<W> wa[U][RT], wb[U][RT];
    walk_two_groups<U>(blo, bhi, wa, wb, load_group, mma_group);
  } else {  // (native's tile over split activations: native/linear.cu mma_walk)
    WRun<W> w[NG][U][RT];
    walk_groups<NG, U>(blo, bhi, w, load_group, mma_group);
  }
}


// The epilogue of one output row value (total over chains): row scale.
template <WeightFmt W>
__device__ __forceinline__ float scaled(const MmaLinearParams& p, float tot, int n) {
  if constexpr (W == WeightFmt::FP8) return __fmul_rn(tot, __ldg(p.w_scale + n));
  return tot;
}

// scaled() with the row scale of the first output the thread stores in wide_epilogue (without
// SwiGLU: output g.tid, row n0 + g.tid % (16 RT)) loaded before the walk, so that its latency is
// hidden behind the walk instead of following it; the other rows load theirs in the epilogue.
// The same product, so the same bits.
template <WeightFmt W, int RT, int NT>
struct EarlyScale {
  int n = -1;
  float s = 0.f;
  __device__ __forceinline__ EarlyScale(const MmaLinearParams& p, int n0, const Group& g) {
    if constexpr (W == WeightFmt::FP8) {
      if (!p.swiglu && g.tid < RT * 16 * 8 * NT && n0 + g.tid % (16 * RT) < p.N) {
        n = n0 + g.tid % (16 * RT);
        s = __ldg(p.w_scale + n);
      }
    }
  }
  __device__ __forceinline__ float operator()(const MmaLinearParams& p, float tot, int row) const {
    if constexpr (W == WeightFmt::FP8) return __fmul_rn(tot, row == n ? s : __ldg(p.w_scale + row));
    return tot;
  }
};

// The epilogue of every wide walk (register, staged, streamed): the row scale (scale: scaled() or
// an EarlyScale), the norm's halves (p.nin: times the token's inv, from p.nin.inv or computed by
// norm_inv_rows at mma_inv_offset_floats before the group's last barrier; p.nout: added into the
// residual stream with the next norm's z and chunk sums instead of stored in y), the store.
// NORM: which of them the caller's op has (kNormAny: decided from p at run time; the decode tile
// is instantiated per mode so that its walk does not pay for the others' code).
template <WeightFmt W, int RT, int NT, int NORM, class Scale>
__device__ __forceinline__ void linear_epilogue(const MmaLinearParams& p, const float* smem, int n0, int t0, Group g,
                                                const Scale& scale) {
  const int P = p.chains;
  // the inv of token tk at inv[tk] (shared or global memory), or no norm
  const float* inv = nullptr;
  if constexpr (NORM == kNormAny || NORM == kNormIn)
    inv = norm_inv_local(p.nin) ? smem + mma_inv_offset_floats(RT, NT, P) : p.nin.inv;
  auto value = [&](int n, int tk, float tot) {
    const float v = scale(p, tot, n);
    return inv ? __fmul_rn(v, inv[tk]) : v;
  };
  if ((NORM == kNormAny || NORM == kNormOut) && p.nout.res) {
    // no SwiGLU and N % 16 == 0 (make_mma_linear_params): the 16 rows of a chunk are 16
    // consecutive threads (a half warp), and the loop's trip count is the same for every lane
    for (int o = g.tid; o < RT * 16 * 8 * NT; o += g.nthreads) {
      const int r = o % (16 * RT), c = o / (16 * RT), n = n0 + r, tk = t0 + c;
      const bool live = n < p.N && tk < p.M;
      const float v = live ? value(n, tk, ordered_total<RT, NT>(smem, P, r >> 4, c, r & 15)) : 0.f;
      norm_out_element(p.nout, live, tk, n, v, g.lane());
    }
    return;
  }
  if constexpr (NORM != kNormOut)
    wide_epilogue<RT, NT>(smem, P, n0, t0, p.N, p.M, p.swiglu != 0, p.alpha, p.limit, g, value,
                          [&](int tk, int col, float v) { p.y[int64_t(tk) * p.ld_y + col] = v; });
}

}  // namespace mma

// ---- wide mode: one item = one tile, warp j of the group = chain j ----
// tile_n: row tile index (rows 16*RT*tile_n ..), tile_t: token tile (tokens 8*NT*tile_t ..).
// smem: mma_wide_smem_floats(RT, NT, p.chains) floats. The group has at least p.chains warps;
// warps past the chains only help with the epilogue. Synchronizes the group.
// NG, UW: the whole walk's groups in registers and blocks a group (chain_sum_whole).
template <WeightFmt W, ActFmt X, int RT, int NT, int NORM = kNormAny, int NG = 2, int UW = mma::kWholeU>
__device__ __forceinline__ void mma_linear_wide_work(const MmaLinearParams& p, int tile_n, int tile_t, Group g,
                                                     float* smem) {
  const int lane = g.lane(), warp = g.warp(), P = p.chains;
  const int n0 = tile_n * 16 * RT, t0 = tile_t * 8 * NT;
  const int blocks = (p.K + kMmaKBlock - 1) / kMmaKBlock;
  const mma::EarlyScale<W, RT, NT> scale(p, n0, g);
  if (warp < P) {
    float chain[RT][NT][4];
    // a whole decode item of native's decode tile (uniform over the group): chain_sum_whole, the
    // same bits. (The mono kernel's body, kNormAny, keeps chain_sum unless it asks for a walk of
    // three or more groups (its option fp8_whole): there the whole walk's two load groups spilled
    // inside its loop and the step ran slower, 2026-12-07, docs/perf.md.)
    constexpr bool kWhole = NT == 1 && (NORM != kNormAny || NG > 2) && (W == WeightFmt::FP8 || W == WeightFmt::BF16);
    if (kWhole && p.K % kMmaKBlock == 0 && n0 + 16 * RT <= p.N) {
      if constexpr (kWhole) {
        const int tk = t0 + (lane >> 2);
        const uint8_t* xrow =
            static_cast<const uint8_t*>(p.x) + int64_t(tk < p.M ? tk : 0) * p.ld_x * act_bytes(X);
        mma::chain_sum_whole<W, X, RT, UW, NG>(p, n0, mma::chain_begin(warp, blocks, P),
                                               mma::chain_begin(warp + 1, blocks, P), lane, xrow, chain);
      }
    } else {
      mma::chain_sum<W, X, RT, NT>(p, n0, t0, mma::chain_begin(warp, blocks, P),
                                   mma::chain_begin(warp + 1, blocks, P), lane, chain);
    }
    mma::store_partials<RT, NT>(chain, warp, lane, smem);
  }
  // the norm's inv after the walk (before it, its code made the walk spill)
  if constexpr (NORM == kNormIn) norm_inv_rows_call(p.nin, g, smem + mma_inv_offset_floats(RT, NT, P));
  else if constexpr (NORM == kNormAny) norm_inv_rows(p.nin, g, smem + mma_inv_offset_floats(RT, NT, P));
  g.sync();
  mma::linear_epilogue<W, RT, NT, NORM>(p, smem, n0, t0, g, scale);
  g.sync();  // smem is reused by the group's next item
}

// ---- staged decode tiles (the mono kernel): the wide decode item (1 x 1 tile) with its weight rows
// copied to shared memory ahead of the item (mma_staged_* in mma_params.h) ----
// One thread: arms `bar` and copies row tile tile_n's rows into `tile` (16-byte aligned): tiled, the
// whole stored tile (16 ld_w bytes, padding rows included) in one copy; row-major, the rows before N
// (ld_w bytes each, at the staged stride). Rows at or past N are never read.
__device__ __forceinline__ void mma_stage_tile(const MmaLinearParams& p, int tile_n, uint8_t* tile, uint64_t* bar) {
  if (p.tiled) {
    const uint32_t bytes = uint32_t(kTileRows * p.ld_w);
    mbar_expect_tx(bar, bytes);
    bulk_g2s(tile, p.w + int64_t(tile_n) * bytes, bytes, bar);
    return;
  }
  const int n0 = tile_n * 16, rows = min(16, p.N - n0);
  const int64_t stride = mma_staged_stride(p.ld_w);
  mbar_expect_tx(bar, uint32_t(rows * p.ld_w));
  for (int r = 0; r < rows; ++r) bulk_g2s(tile + r * stride, p.w + int64_t(n0 + r) * p.ld_w, uint32_t(p.ld_w), bar);
}

// The decode item w (mma_linear_wide_item with RT = NT = 1) from its staged tile; the same bits.
// The tile must be complete (its barrier waited on by every thread of the group).
template <WeightFmt W, ActFmt X>
__device__ __forceinline__ void mma_linear_staged_item(const MmaLinearParams& p, int64_t w, Group g, uint8_t* smem,
                                                       const uint8_t* tile) {
  const int tiles_n = mma_row_tiles(p);
  const int tile_n = int(w % tiles_n), tile_t = int(w / tiles_n);
  float* part = reinterpret_cast<float*>(smem);
  const int lane = g.lane(), warp = g.warp(), P = p.chains;
  const int n0 = tile_n * 16, t0 = tile_t * 8;
  const int blocks = (p.K + kMmaKBlock - 1) / kMmaKBlock;
  const mma::EarlyScale<W, 1, 1> scale(p, n0, g);
  norm_inv_rows(p.nin, g, part + mma_inv_offset_floats(1, 1, P));
  if (warp < P) {
    float chain[1][1][4];
    mma::chain_sum<W, X, 1, 1, true>(p, n0, t0, mma::chain_begin(warp, blocks, P),
                                     mma::chain_begin(warp + 1, blocks, P), lane, chain, tile);
    mma::store_partials<1, 1>(chain, warp, lane, part);
  }
  g.sync();
  mma::linear_epilogue<W, 1, 1, kNormAny>(p, part, n0, t0, g, scale);
  g.sync();  // smem (and the tile) are reused by the group's next item
}

// ---- deep mode: CTA tiles through a shared-memory ring ----
// Item = CTA tile of kMmaDeepRows rows x kMmaDeepTokens tokens (row group fastest); kMmaDeepWarps
// warps, warp w the warp tile of 64 rows (4 row tiles) from 64 (w % kMmaDeepRowGroups) and 32
// tokens from 32 (w / kMmaDeepRowGroups). The item's K blocks go through a ring of
// mma_deep_stages(W) stages that all threads fill with cp.async that many - 1 blocks ahead: the
// block's activations of the tile's tokens (zero past M and for 16-byte runs at or past K) and
// its weight codes (zero past N and past K). Each warp walks its chains exactly as chain_sum does
// (the same runs, steps, block sums from +0 and chain sums), chains 0..P-2 into its running total
// (add_running), then deep_epilogue: the bits of the wide walk.
namespace mma {

// Stage layout: activations [tokens][64 elements] (fp32: 16 chunks of 16 bytes a token, swizzled
// so that a quarter warp's 8 float4 reads of one step hit 8 bank groups), then the weights [rows][64
// elements] (FP8: 4 chunks a row, conflict-free as they are; BF16: 8, chunk ^ (row & 1)).
template <ActFmt X>
__device__ __forceinline__ int deep_act_chunk(int row, int c) {
  if constexpr (X == ActFmt::F32) return c ^ (((c >> 3) & 1) | ((row & 1) << 1));
  return c;
}
template <WeightFmt W>
__device__ __forceinline__ int deep_w_chunk(int row, int c) {
  if constexpr (W == WeightFmt::BF16) return c ^ (row & 1);
  return c;
}

// Block b of the tile (rows n0.., tokens t0..) into stage st: every thread of the CTA.
template <WeightFmt W, ActFmt X>
__device__ __forceinline__ void deep_linear_issue(const MmaLinearParams& p, int n0, int t0, int b, uint8_t* st,
                                                  int tid) {
  constexpr int kThreads = 32 * kMmaDeepWarps;
  constexpr int xe = X == ActFmt::F32 ? 4 : 2, we = is_e4m3(W) ? 1 : 2;
  constexpr int xchunks = kMmaKBlock * xe / 16, wchunks = kMmaKBlock * we / 16;
  // activations: chunk c of token row holds elements 64b + c (16 / xe) ..
#pragma unroll
  for (int q = tid; q < kMmaDeepTokens * xchunks; q += kThreads) {
    const int row = q / xchunks, c = q % xchunks, tk = t0 + row, k = b * kMmaKBlock + c * (16 / xe);
    const bool ok = tk < p.M && k < p.K;
    const uint8_t* src = static_cast<const uint8_t*>(p.x);
    if (ok) src += (int64_t(tk) * p.ld_x + k) * xe;
    cp_async_16(st + (row * xchunks + deep_act_chunk<X>(row, c)) * 16, src, ok ? 16 : 0);
  }
  // weights: chunk c of row holds elements 64b + c (16 / we) ..
  uint8_t* wst = st + mma_deep_act_bytes(X);
#pragma unroll
  for (int q = tid; q < kMmaDeepRows * wchunks; q += kThreads) {
    const int row = q / wchunks, c = q % wchunks, n = n0 + row, k = b * kMmaKBlock + c * (16 / we);
    const bool ok = n < p.N && k < p.K;
    const uint8_t* src = p.w;
    if (ok) {
      if (is_e4m3(W) && p.tiled) src += tiled_offset(n, 0, p.ld_w) + int64_t(b) * kTileBlockStride + 16 * c;
      else src += int64_t(n) * p.ld_w + (int64_t(b) * kMmaKBlock) * we + 16 * c;
    }
    cp_async_16(wst + (row * wchunks + deep_w_chunk<W>(row, c)) * 16, src, ok ? 16 : 0);
  }
}

}  // namespace mma

template <WeightFmt W, ActFmt X>
__device__ __forceinline__ void mma_linear_deep_work(const MmaLinearParams& p, int64_t item, Group g, uint8_t* smem) {
  constexpr int RT = 4, NT = 4, S = mma_deep_stages(W);
  constexpr int xe = X == ActFmt::F32 ? 4 : 2, we = is_e4m3(W) ? 1 : 2;
  constexpr int xchunks = kMmaKBlock * xe / 16, wchunks = kMmaKBlock * we / 16;
  const int groups = mma_deep_row_groups(p), P = p.chains;
  const int n0 = int(item % groups) * kMmaDeepRows, t0 = int(item / groups) * kMmaDeepTokens;
  const int blocks = (p.K + kMmaKBlock - 1) / kMmaKBlock;
  const int lane = g.lane(), warp = g.warp(), gl = lane >> 2, t = lane & 3;
  const int wr0 = 16 * RT * (warp % kMmaDeepRowGroups), wt0 = 8 * NT * (warp / kMmaDeepRowGroups);
  const int stage_bytes = mma_deep_stage_bytes(W, X);
  float* wsmem = reinterpret_cast<float*>(smem + S * stage_bytes) + warp * mma_deep_smem_floats_per_warp(RT, NT);

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < blocks) mma::deep_linear_issue<W, X>(p, n0, t0, s, smem + s * stage_bytes, g.tid);
    cp_async_commit();
  }
  float chain[RT][NT][4];
  mma::zero<RT, NT>(chain);
  int j = 0, chain_end = mma::chain_begin(1, blocks, P), stage = 0;
  for (int b = 0; b < blocks; ++b) {
    // MXFP8: block b's scale bytes from global memory (small, cached), issued before the wait so
    // their latency hides behind it
    mma::WRun<W> wr[RT];
    if constexpr (W == WeightFmt::MXFP8) {
      bool rok[RT][2];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) rok[rt][h] = n0 + wr0 + rt * 16 + 8 * h + gl < p.N;
      mma::load_mx<W, RT>(wr, p, n0 + wr0, gl, rok, b * kMmaKBlock + 16 * t);
    }
    cp_async_wait<S - 2>();
    g.sync();  // block b is in `stage` for every thread; the stage before it is free again
    if (b + S - 1 < blocks)
      mma::deep_linear_issue<W, X>(p, n0, t0, b + S - 1, smem + (stage == 0 ? S - 1 : stage - 1) * stage_bytes, g.tid);
    cp_async_commit();
    const uint8_t* st = smem + stage * stage_bytes;
    const uint8_t* wst = st + mma_deep_act_bytes(X);
    const int kc = b * kMmaKBlock + 16 * t;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wr0 + rt * 16 + 8 * h + gl;
#pragma unroll
        for (int i = 0; i < mma::WRun<W>::kVec; ++i)
          wr[rt].v[h][i] = mma::ld_shared_16(wst + (row * wchunks + mma::deep_w_chunk<W>(row, t * mma::WRun<W>::kVec + i)) * 16);
      }
    // token tile nt's step s from the stage: elements kc + 4s .. + 3 of token wt0 + 8 nt + gl
    auto act = [&](auto full, int nt, int s, uint32_t(&bh)[2], uint32_t(&bl)[2]) {
      constexpr bool FULL = decltype(full)::value;
      const int row = wt0 + 8 * nt + gl, k = kc + 4 * s;
      const uint8_t* xr = st + row * xchunks * 16;
      if constexpr (X == ActFmt::F32) {
        const int c = 4 * t + s;
        const uint4 u = mma::ld_shared_16(xr + mma::deep_act_chunk<X>(row, c) * 16);
        float4 v = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
        if constexpr (!FULL) {
          if (k + 1 >= p.K) v.y = 0.f;
          if (k + 2 >= p.K) v.z = 0.f;
          if (k + 3 >= p.K) v.w = 0.f;
        }
        mma::split_hi_lo(v.x, v.y, bh[0], bl[0]);
        mma::split_hi_lo(v.z, v.w, bh[1], bl[1]);
      } else {
        const uint8_t* at = xr + (2 * t + (s >> 1)) * 16 + 8 * (s & 1);
        uint2 v = *reinterpret_cast<const uint2*>(at);
        if constexpr (!FULL) {  // (a chunk of 8 holds two steps: the second may start at or past K)
          if (k >= p.K) v = make_uint2(0, 0);
          if (k + 1 >= p.K) v.x &= 0xffffu;
          if (k + 2 >= p.K) v.y = 0;
          else if (k + 3 >= p.K) v.y &= 0xffffu;
        }
        bh[0] = v.x;
        bh[1] = v.y;
        bl[0] = bl[1] = 0;
      }
    };
    float blk[RT][NT][4];
    mma::zero<RT, NT>(blk);
    if ((b + 1) * kMmaKBlock <= p.K)
      mma::block_steps<W, X, RT, NT>(
          wr, [&](int nt, int s, uint32_t(&bh)[2], uint32_t(&bl)[2]) { act(std::true_type{}, nt, s, bh, bl); }, blk);
    else
      mma::block_steps<W, X, RT, NT>(
          wr, [&](int nt, int s, uint32_t(&bh)[2], uint32_t(&bl)[2]) { act(std::false_type{}, nt, s, bh, bl); }, blk);
    mma::add_into<RT, NT>(chain, blk);
    stage = stage + 1 == S ? 0 : stage + 1;
    if (b + 1 == chain_end && j + 1 < P) {  // chain j done: into the running total, the next from +0
      mma::add_running<RT, NT>(wsmem, chain, j, lane);
      mma::zero<RT, NT>(chain);
      chain_end = mma::chain_begin(++j + 1, blocks, P);
    }
  }
  cp_async_wait<0>();
  mma::deep_epilogue<RT, NT>(
      wsmem, chain, P, n0 + wr0, t0 + wt0, p.N, p.M, p.swiglu != 0, p.alpha, p.limit, lane,
      [&](int n, int tk, float tot) {  // (tokens past M are not stored: no inv read for them)
        const float v = mma::scaled<W>(p, tot, n);
        return tk < p.M ? norm_apply(p.nin, nullptr, tk, v) : v;
      },
      [&](int tk, int col, float v) { p.y[int64_t(tk) * p.ld_y + col] = v; });
}

// ---- the ops (mma_linear_shape) ----
// Wide, any tiling: item = (row tile, token tile), row tile fastest.
template <WeightFmt W, ActFmt X, int RT, int NT, int NORM = kNormAny, int NG = 2, int UW = mma::kWholeU>
__device__ __forceinline__ void mma_linear_wide_item(const MmaLinearParams& p, int64_t w, Group g, uint8_t* smem) {
  const int tiles_n = mma_row_tiles(p);
  mma_linear_wide_work<W, X, RT, NT, NORM, NG, UW>(p, int(w % tiles_n), int(w / tiles_n), g,
                                                   reinterpret_cast<float*>(smem));
}
template <WeightFmt W, ActFmt X, int RT, int NT>
struct MmaWideOp : OpBounds<kMmaMaxChains * 32, 1> {
  using Params = MmaLinearParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    mma_linear_wide_item<W, X, RT, NT>(p, w, g, smem);
  }
};
// The decode tile (1 x 1) held to 128 registers: 16 warps per SM, as many as mma_linear_chains
// puts on an SM (at most 16 / ceil(tiles / SMs) chains an item: one wave). (It was held to 72, 28
// warps an SM, until 2026-12-07: chain_sum_whole's two load groups spill there.)
// NORM: the norm's halves it handles (kNormNone, kNormIn: p.nin, kNormOut: p.nout; native's
// launcher picks by mma_norm_mode, so that the plain tile's code is what it was and each mode
// spills no more than it must; kNormAny: all, decided from p, the mono kernel's one body for every
// mode: measured faster there than one body per mode, 2026-12-03). NG, UW: the whole walk's
// register groups and blocks a group (2 x kWholeU here; native's launcher runs the tile over split
// activations at 4 x 1, native/linear.cu mma_walk).
template <WeightFmt W, ActFmt X, int NORM = kNormNone, int NG = 2, int UW = mma::kWholeU>
struct MmaDecodeOp : OpBounds<kMmaMaxChains * 32, 0, 128> {
  using Params = MmaLinearParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    mma_linear_wide_item<W, X, 1, 1, NORM, NG, UW>(p, w, g, smem);
  }
  // The same item with its weight rows staged at tile (mma_stage_tile); the same bits.
  __device__ static void run_staged(const Params& p, int64_t w, Group g, uint8_t* smem, const uint8_t* tile) {
    mma_linear_staged_item<W, X>(p, w, g, smem, tile);
  }
};
// Deep: item = one CTA tile (mma_linear_deep_work), 4 x 4 warp tiles only.
template <WeightFmt W, ActFmt X, int RT, int NT>
struct MmaDeepOp : OpBounds<kMmaDeepWarps * 32, 1> {
  static_assert(RT == 4 && NT == 4, "the deep walk's warp tile is 4 x 4");
  static_assert(X != ActFmt::F32Split, "split activations feed the decode tile only");
  using Params = MmaLinearParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    mma_linear_deep_work<W, X>(p, w, g, smem);
  }
};

}  // namespace m3::kernels
