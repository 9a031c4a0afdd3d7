// MXFP4 expert projections on tensor cores, grouped by expert, batch-invariant (native/moe.h).
//   gate/up: h[p, j] = swiglu_oai(sum_k W13[2j, k] x[row(p), k], sum_k W13[2j+1, k] x[row(p), k])
//   down   : y[p, n] = sum_k W2[n, k] h[p, k]
// Weights (moe_mxfp4.cuh): codes [slots][N][ld bytes] (E2M1, element 2i in the low nibble of byte i,
// rows padded to whole 32-element blocks, ld % 16 == 0), scales [slots][N][sld] (E8M0, one per 32
// inputs). Value of a code: e2m1 * 2^(S - 127). Outputs fp32 [pairs][ld_y].
// Activations come split (moe_split_work; the gate/up kernel writes its SwiGLU outputs this way too,
// for the down kernel): x = hi + lo, hi = bf16_rn(x), lo = bf16_rn(x - hi) (x - hi is exact in fp32,
// |x - hi - lo| <= 2^-18 |x|), stored per group of 8 elements k = 8G .. 8G + 7 as 32 bytes:
//   uint32 words 0..3 = bf16x2 {hi(8G + i), hi(8G + i + 4)}, i = 0..3; words 4..7 the same for lo;
// rows of ld_xs uint16 (>= 2 round_up(K, 128), 16-byte aligned). Elements at or past K are masked
// to zero by the reader, so the writer may leave them unset.
// Routing (router.cuh, moe_group_work): entry a = expert slot entry_slot[a] with pairs
// [entry_begin[a], entry_begin[a+1]); pair p reads activation row pair_row[p] (p when null) and
// writes output row p. Entries at or past *num_entries do nothing (grids sized for the most).
//
// MMA (swap-AB, as kernels/mma_linear.cuh): mma.sync m16n8k16 bf16 x bf16 -> fp32; the 16 MMA rows
// are 16 weight rows, the 8 MMA columns are 8 pairs (tokens) of one entry. Lane l: g = l / 4 (rows
// g and g + 8 of a row tile; token g of a token tile), t = l % 4.
// K layout: blocks of 128 elements. In block b, lane t owns the 32 elements 128b + 32t .. + 31 of
// its rows = the 16 bytes of chunk c = 4b + t (one 16-byte load per row) = exactly one E8M0 block
// (one scale byte per row). Word j (0..3) of the chunk holds elements e = 8j .. 8j + 7 (nibble i =
// element 8j + i). MMA step s (0..7) of the block uses word j = s / 2, q = 2 (s % 2):
//   logical columns {2t, 2t+1} = elements {8j+q, 8j+q+4},  {2t+8, 2t+9} = {8j+q+1, 8j+q+5}
//   a0 = row g  {q, q+4}, a1 = row g+8 {q, q+4}, a2 = row g {q+1, q+5}, a3 = row g+8 {q+1, q+5}
//   b0 = token g {q, q+4},  b1 = token g {q+1, q+5}          (element offsets inside word j)
//   = words q and q + 1 of the token's split group G = (128b + 32t + 8j) / 8 (hi words for the hi
//   MMA, lo words for the lo MMA): two 16-byte loads per group and token.
// (over s and the four nibble pairs, every element of the lane's 32 is used once). Elements at or
// past K read as zero activations (the weights there are finite codes, so the products are 0).
// Operands in bf16, exactly:
//   - E2M1 code c = s e1 e0 m: (c * (2^6 + 2^12)) & 0x81c0 puts e1 e0 m at bf16 bits 8..6 and s at
//     bit 15 (two codes per 32-bit word at once, nibbles q and q + 4 of a word; e2m1_pair), the bf16 of
//     e2m1 * 2^-126 (code 0.5 a bf16 subnormal); one bf16x2 multiply by 2^(S - 1) gives
//     e2m1 * 2^(S - 127) exactly: the multiplier is a normal bf16 for S <= 128 and the product
//     has at most 2 significant bits and is >= 2^-128 (S >= 0): exact for every S in [0, 128],
//     i.e. block scales <= 2 (|w| <= 12). The quantizer (model/quantize.cpp) picks S = the
//     block's amax exponent - 2 + 127, so S > 128 needs |w| >= 8 in a block; expert weights sit
//     near 2^-7 (S ~ 120). A scale S > 128 is NOT silently wrong: the multiplier becomes +inf and
//     the outputs that use the block become inf/NaN.
//   - fp32 activations: x = hi + lo as above, both multiplied (hi MMA, then lo MMA, per step).
// Summation order (the invariance contract), B = ceil(K / 128) blocks, P = moe_mma_chains(N, K,
// SMs) chains (a function of N, K and the device's SM count ONLY):
//   chain j covers blocks [j*B/P, (j+1)*B/P);
//   block sum = the block's 8 steps (hi MMA then lo MMA each) accumulated from +0 in the MMA;
//   chain sum = +0 + block sum + block sum + ... in block order (fp32 adds);
//   row total = chain 0 + chain 1 + ... + chain P-1 (left to right, fp32 adds); then SwiGLU.
// Each MMA output element depends only on its own row of A and column of B, so a pair's result
// depends on its activations, the expert's weights and (N, K, SMs): never on the number of pairs
// of its entry, on M, on its column or token tile, on the tiling (RT, NT) or on the mode. No
// atomics, no cross-CTA sums.
// MXFP8 experts (p.fp8, MoeWideFp8Op / MoeDeepFp8Op; the MXFP8 release): E4M3 codes, one byte an element, rows of
// ld >= round_up(K, 32) bytes, the same E8M0 scale per 32 elements. Lane t's 32 elements of block b
// are then 32 bytes (two 16-byte loads a row: WBlk8); word j's elements 8j .. 8j + 7 are bytes
// 8j .. 8j + 7, and a byte permute of its two 32-bit words puts elements {q, q + 4, q + 1, q + 5}
// in one word, decoded exactly as kernels/mma_linear.cuh decodes E4M3 with the block scale folded
// into the bf16 multiplier (2^(S - 7): exact for S in 4 .. 134; the arena refuses other scales).
// The same steps, chains and order as MXFP4, so the same contract. The register and deep walks (the
// staged ring reads MXFP4 tiles); the deep ring holds 128-byte code rows a block (deep_chunk8).
// Two ways to walk the same chains:
//   wide (decode): CTA = (row tile of 16*RT rows, entry), P warps = the P chains in parallel, the
//     entry's pairs in token tiles of 8*NT one after another; chain sums meet in shared memory.
//     Weights reach the registers either directly (chain_sum: two register groups, one in flight)
//     or through a per-warp ring of shared-memory stages filled by cp.async (chain_sum_staged:
//     the same blocks and sums, more bytes in flight; needs 4-byte aligned scale rows).
//   deep (prefill): one warp = one warp tile (32 rows x 32 pairs of one entry), all chains one
//     after another (running total in per-warp shared memory); persistent CTAs of 8 warps walk a
//     list of CTA tiles (128 rows x 64 pairs), each K block's activations and codes staged once per
//     CTA in a shared-memory ring (moe_mma_deep_work).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/bulk_copy.cuh"
#include "kernels/cp_async.cuh"
#include "kernels/mma_linear.cuh"
#include "kernels/moe_params.h"
#include "kernels/swiglu.cuh"
#include "kernels/weight_stream.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

namespace moe_mma {

// One row tile's run of one block for this lane: chunk c of rows g (h = 0) and g + 8 (h = 1), and
// the rows' bf16x2 multipliers {2^(S-1), 2^(S-1)}.
struct WBlk {
  uint4 v[2];
  uint32_t m[2];
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// bf16x2 {2^(S-1), 2^(S-1)}; S > 128 gives +inf (see the header).
__device__ __forceinline__ uint32_t scale_mult(uint32_t s) {
  const uint32_t e = min(s + 126u, 255u) << 7;
  return e | (e << 16);
}

// scale_mult in one integer multiply-add, (S + 126) (2^7 + 2^23): the same word for S <= 129 (S = 129
// gives +inf as well), a wrong one above. For scales read from an arena only: filling it refuses
// scales above model/prepare.h's kMxfp4ArenaMaxScale (128).
__device__ __forceinline__ uint32_t scale_mult_arena(uint32_t s) { return s * 0x00800080u + 0x3f003f00u; }

// Nibbles q' and q' + 4 (q' = 0 or 1) of w -> bf16x2 {value(q'), value(q' + 4)} times 2^(S-127)
// (m from scale_mult): mask the two codes in place, one integer multiply by 2^(6-4q') + 2^(12-4q')
// puts e1 e0 m at bits 8..6 and the sign at bit 15 of each half (no carry across halves: the low
// half's product is < 2^16), mask, multiply by m. Nibbles 2 and 3 (and 6, 7) go through w >> 8.
template <int Q>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w, uint32_t m) {
  static_assert(Q == 0 || Q == 1, "nibble 0 or 1 of a (shifted) word");
  const uint32_t c = w & (0x000f000fu << (4 * Q));
  return mma::bf16x2_mul((c * (Q == 0 ? 4160u : 260u)) & 0x81c081c0u, m);
}

// The A fragment of step s (see the header): word j = s / 2, nibble pairs q = 2 (s % 2) and q + 1.
__device__ __forceinline__ void frag(const WBlk& r, int s, uint32_t (&a)[4]) {
  const int j = s >> 1;
  const uint32_t w0 = word_of(r.v[0], j) >> (8 * (s & 1)), w1 = word_of(r.v[1], j) >> (8 * (s & 1));
  a[0] = e2m1_pair<0>(w0, r.m[0]);
  a[1] = e2m1_pair<0>(w1, r.m[1]);
  a[2] = e2m1_pair<1>(w0, r.m[0]);
  a[3] = e2m1_pair<1>(w1, r.m[1]);
}

// MXFP8 (see the header): one row tile's run of one block for this lane, 32 bytes of rows g (h = 0)
// and g + 8 (h = 1), and the rows' E8M0 bytes packed (row g bits 0..15, row g + 8 bits 16..31; one
// register: the walk is short of them), turned into multipliers (mma::mx_mul) when decoded.
struct WBlk8 {
  uint4 v[2][2];
  uint32_t m;
};

// The A fragment of step s of an MXFP8 run: word j = s / 2 is bytes 8j .. 8j + 7, i.e. 32-bit words
// 2 (j % 2) and 2 (j % 2) + 1 of uint4 j / 2; elements {q, q + 4} -> a[h], {q + 1, q + 5} -> a[h + 2].
__device__ __forceinline__ void frag(const WBlk8& r, int s, uint32_t (&a)[4]) {
  const int j = s >> 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint4& v = r.v[h][j >> 1];
    const uint32_t w0 = (j & 1) ? v.z : v.x, w1 = (j & 1) ? v.w : v.y;
    mma::e4m3x4_to_bf16x2(__byte_perm(w0, w1, (s & 1) ? 0x7362 : 0x5140), a[h], a[h + 2],
                          mma::mx_mul(h ? r.m >> 16 : r.m & 0xffffu));
  }
}

// Chunk c of rows crow[h] (scales srow[h]); zero codes where ok[h] is false.
__device__ __forceinline__ void load_wblk(WBlk8& r, const uint8_t* const (&crow)[2], const uint8_t* const (&srow)[2],
                                          const bool (&ok)[2], int c) {
  r.m = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = crow[h] + int64_t(c) * 32;
    r.v[h][0] = ok[h] ? wstream::ld_stream(q) : make_uint4(0, 0, 0, 0);
    r.v[h][1] = ok[h] ? wstream::ld_stream(q + 16) : make_uint4(0, 0, 0, 0);
    if (ok[h]) r.m |= uint32_t(__ldg(srow[h] + c)) << (16 * h);  // (zero codes: any scale)
  }
}

// Chunk c of rows crow[h] (scales srow[h]); zero codes where ok[h] is false.
__device__ __forceinline__ void load_wblk(WBlk& r, const uint8_t* const (&crow)[2], const uint8_t* const (&srow)[2],
                                          const bool (&ok)[2], int c) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.v[h] = ok[h] ? wstream::ld_stream(crow[h] + int64_t(c) * 16) : make_uint4(0, 0, 0, 0);
    r.m[h] = scale_mult(ok[h] ? uint32_t(__ldg(srow[h] + c)) : 127u);
  }
}

// Zero the elements at or past K of a split group (k = its first element; word i: low half element
// k + i, high half k + i + 4).
__device__ __forceinline__ void mask_past_k(int k, int K, uint4& hi, uint4& lo) {
  auto mask = [&](int i) { return (k + i < K ? 0x0000ffffu : 0u) | (k + i + 4 < K ? 0xffff0000u : 0u); };
  const uint32_t m0 = mask(0), m1 = mask(1), m2 = mask(2), m3 = mask(3);
  hi.x &= m0; hi.y &= m1; hi.z &= m2; hi.w &= m3;
  lo.x &= m0; lo.y &= m1; lo.z &= m2; lo.w &= m3;
}

// Split group k / 8 of a token's row (k = 128b + 32t + 8j): hi and lo words {e_i, e_i+4}, i = 0..3
// (see the header); zero for a padding token and (FULL false) elements at or past K.
template <bool FULL>
__device__ __forceinline__ void act_group(const uint16_t* xr, bool ok, int k, int K, uint4& hi, uint4& lo) {
  hi = make_uint4(0, 0, 0, 0);
  lo = hi;
  if (ok && (FULL || k < K)) {
    const uint4* q = reinterpret_cast<const uint4*>(xr + 2 * int64_t(k));
    hi = __ldg(q);
    lo = __ldg(q + 1);
  }
  if constexpr (!FULL) mask_past_k(k, K, hi, lo);
}

// B fragments (hi, lo) of step 2j + odd from word j's group: words 2 odd and 2 odd + 1.
__device__ __forceinline__ void act_frag(const uint4& hi, const uint4& lo, int odd, uint32_t (&bh)[2],
                                         uint32_t (&bl)[2]) {
  bh[0] = odd ? hi.z : hi.x;
  bh[1] = odd ? hi.w : hi.y;
  bl[0] = odd ? lo.z : lo.x;
  bl[1] = odd ? lo.w : lo.y;
}

// The split group of fp32 elements x[8G .. 8G + 7] (k = 8G; row readable up to round_up(K, 4)
// elements): zero at or past K.
__device__ __forceinline__ void split_group(const float* xr, int k, int K, uint4& hi, uint4& lo, float scale = 1.f) {
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0.f;
  if (k + 8 <= K) {
    const float4 a = *reinterpret_cast<const float4*>(xr + k), b = *reinterpret_cast<const float4*>(xr + k + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (k + i < K) v[i] = xr[k + i];
  }
  if (scale != 1.f)
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], scale);
  mma::split_hi_lo(v[0], v[4], hi.x, lo.x);
  mma::split_hi_lo(v[1], v[5], hi.y, lo.y);
  mma::split_hi_lo(v[2], v[6], hi.z, lo.z);
  mma::split_hi_lo(v[3], v[7], hi.w, lo.w);
}

// One output value v of element j of a split row (the writer side of the layout).
__device__ __forceinline__ void store_split(uint16_t* row, int j, float v) {
  const uint32_t h = mma::pack_bf16x2(v, 0.f) & 0xffffu;
  const float r = __fsub_rn(v, __uint_as_float(h << 16));
  const uint32_t l = mma::pack_bf16x2(r, 0.f) & 0xffffu;
  const int i = j & 7;
  uint16_t* g = row + 16 * int64_t(j >> 3) + 2 * (i & 3) + (i >> 2);
  g[0] = uint16_t(h);
  g[8] = uint16_t(l);
}

// One block's 8 steps (hi MMA then lo MMA) from +0 into blk, added to chain. act(nt, j, hi, lo):
// token tile nt's split group j of the lane's run (element k = kc + 8j, kc = 128b + 32t) as
// act_group<FULL> gives it (zero for padding tokens and, FULL false, past K). AG (one token tile):
// the token's groups loaded AG at a time before their steps (4: the whole run, 8 loads in flight).
template <int RT, int NT, class Act, class B = WBlk, int AG = 4>
__device__ __forceinline__ void block_mma_with(const B (&wr)[RT], Act act, float (&chain)[RT][NT][4]) {
  static_assert(AG == 1 || AG == 2 || AG == 4, "the run's 4 groups AG at a time");
  float blk[RT][NT][4];
  mma::zero<RT, NT>(blk);
  // (MXFP8 runs hold twice the weight registers: their activations go group by group, below)
  if constexpr (NT == 1 && !std::is_same_v<B, WBlk8>) {  // decode: AG groups of the token's run, then their steps
#pragma unroll
    for (int j0 = 0; j0 < 4; j0 += AG) {
      uint4 v0[AG], v1[AG];
#pragma unroll
      for (int j = 0; j < AG; ++j) act(0, j0 + j, v0[j], v1[j]);
#pragma unroll
      for (int s = 2 * j0; s < 2 * (j0 + AG); ++s) {
        uint32_t bh[2], bl[2];
        act_frag(v0[(s >> 1) - j0], v1[(s >> 1) - j0], s & 1, bh, bl);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          uint32_t a[4];
          frag(wr[rt], s, a);
          mma::mma_bf16(blk[rt][0], a, bh[0], bh[1]);
          mma::mma_bf16(blk[rt][0], a, bl[0], bl[1]);
        }
      }
    }
  } else {  // several token tiles (or an MXFP8 run): each step's weight fragments decoded once, used by every tile
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 v0[NT], v1[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) act(nt, j, v0[nt], v1[nt]);
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        uint32_t a[RT][4];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) frag(wr[rt], 2 * j + odd, a[rt]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t bh[2], bl[2];
          act_frag(v0[nt], v1[nt], odd, bh, bl);
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            mma::mma_bf16(blk[rt][nt], a[rt], bh[0], bh[1]);
            mma::mma_bf16(blk[rt][nt], a[rt], bl[0], bl[1]);
          }
        }
      }
    }
  }
  mma::add_into<RT, NT>(chain, blk);
}

// block_mma_with, the activations read from global memory (rows xr[nt], tok[nt]: a real pair).
template <int RT, int NT, bool FULL, class B>
__device__ __forceinline__ void block_mma(const B (&wr)[RT], const uint16_t* const (&xr)[NT], const bool (&tok)[NT],
                                          int kc, int K, float (&chain)[RT][NT][4]) {
  block_mma_with<RT, NT>(
      wr, [&](int nt, int j, uint4& hi, uint4& lo) { act_group<FULL>(xr[nt], tok[nt], kc + 8 * j, K, hi, lo); }, chain);
}

// Blocks per load group of the wide (decode) walk, one token tile: two groups in registers (one in
// flight while the other is multiplied) of two blocks at RT 1, one at RT 2. (Prefill runs the deep
// walk, moe_mma_deep_work.)
template <int RT, int NT>
constexpr int blocks_in_flight() {
  static_assert(NT == 1, "the wide walk runs one token tile");
  return RT == 1 ? 2 : 1;
}

// One chain: blocks [blo, bhi) of rows n0 .. n0 + 16*RT - 1 of one slot (codes, scales) for the
// tokens xr[nt] (tok[nt]: a real pair); chain = +0 + block sum + ... (the header's order).
template <int RT, int NT, int U = blocks_in_flight<RT, NT>(), class B = WBlk>
__device__ __forceinline__ void chain_sum(const MoeMmaParams& p, const uint8_t* codes, const uint8_t* scales, int n0,
                                          const uint16_t* const (&xr)[NT], const bool (&tok)[NT], int blo, int bhi,
                                          int lane, float (&chain)[RT][NT][4]) {
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = (p.K + 31) / 32;
  const uint8_t* crow[RT][2];
  const uint8_t* srow[RT][2];
  bool rok[RT][2];
  mma::tile_rows<RT>(codes, p.ld, n0, g, p.N, crow, rok);
  mma::tile_rows<RT>(scales, p.sld, n0, g, p.N, srow, rok);
  mma::zero<RT, NT>(chain);

  // blocks b .. b + U - 1 (those before bhi) into wr
  auto load_group = [&](B(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = 4 * (b + u) + t;
      const bool live = b + u < bhi && c < nchunks;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const bool ok[2] = {live && rok[rt][0], live && rok[rt][1]};
        load_wblk(wr[u][rt], crow[rt], srow[rt], ok, c);
      }
    }
  };
  // their MMAs, in block order
  auto mma_group = [&](const B(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b + u >= bhi) break;  // warp-uniform
      const int kc = (b + u) * kMoeKBlock + 32 * t;
      if ((b + u + 1) * kMoeKBlock <= p.K) block_mma<RT, NT, true>(wr[u], xr, tok, kc, p.K, chain);
      else block_mma<RT, NT, false>(wr[u], xr, tok, kc, p.K, chain);
    }
  };
  // two groups in registers, the next group's loads in flight during this group's MMAs
  static_assert(NT == 1, "the wide walk runs one token tile");
  if constexpr (std::is_same_v<B, WBlk8>) {
    // MXFP8: one group at a time (its 32-byte runs are already the bytes two MXFP4 groups hold in
    // flight; two groups spilled 300 / 512 bytes at 128 registers, ptxas 2026-12-06, one 36 / 44)
    B wa[U][RT];
    for (int b = blo; b < bhi; b += U) {
      load_group(wa, b);
      mma_group(wa, b);
    }
    return;
  }
  // (mma::walk_two_groups' loop, written out: through the helper, nvcc schedules this walk's
  // loads differently, nvdisasm 2026-12-07; not measured, so this one keeps its own copy)
  B wa[U][RT], wb[U][RT];
  load_group(wa, blo);
  for (int b = blo; b < bhi; b += 2 * U) {
    if (b + U < bhi) load_group(wb, b + U);
    mma_group(wa, b);
    if (b + U >= bhi) break;
    if (b + 2 * U < bhi) load_group(wa, b + 2 * U);
    mma_group(wb, b + U);
  }
}

// chain_sum for a whole item of MXFP4 runs (every row of the tile < N, K % kMoeKBlock == 0) and one
// token tile: the same blocks, block sums and chain sum (the same bits), with fewer instructions a
// block and more bytes in flight. NG load groups of U blocks in registers, NG - 1 of them in flight
// while one is multiplied. No bounds or zero fills on the loads; the padding tokens' columns read
// a real row (xr is always a readable row) instead of zeros: an MMA output column depends only on
// its own activation column, and the epilogue stores real pairs only. Each row's code and scale
// pointers and the token's activation pointer advance once a load group, every load of the group
// at an immediate offset from them; the scales become multipliers in one multiply-add
// (scale_mult_arena: the arena's scales are at most 128).
template <int RT, int NG, int U, int AG = 4>
__device__ __forceinline__ void chain_sum_whole(const MoeMmaParams& p, const uint8_t* codes, const uint8_t* scales,
                                                int n0, const uint16_t* xr, int blo, int bhi, int lane,
                                                float (&chain)[RT][1][4]) {
  static_assert(NG >= 2, "at least one group in flight while one is multiplied");
  const int g = lane >> 2, t = lane & 3;
  // block b of row n: codes at n ld + 64 b + 16 t, its scale byte at n sld + 4 b + t; the token's
  // split groups j = 0..3 of the block at uint4 32 b + 8 t + 2 j (hi) and + 1 (lo)
  const uint8_t* cp[RT][2];
  const uint8_t* sp[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + rt * 16 + g + 8 * h;
      cp[rt][h] = codes + n * p.ld + 64 * blo + 16 * t;
      sp[rt][h] = scales + n * p.sld + 4 * blo + t;
    }
  const uint4* xp = reinterpret_cast<const uint4*>(xr) + 32 * blo + 8 * t;
  mma::zero<RT, 1>(chain);
  if (blo >= bhi) return;
  // blocks b .. b + U - 1 (those before bhi) at the pointers, which then pass them
  auto load_group = [&](WBlk(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u > 0 && b + u >= bhi) break;  // warp-uniform
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wr[u][rt].v[h] = wstream::ld_stream(cp[rt][h] + 64 * u);
          wr[u][rt].m[h] = scale_mult_arena(__ldg(sp[rt][h] + 4 * u));
        }
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        cp[rt][h] += 64 * U;
        sp[rt][h] += 4 * U;
      }
  };
  // block u of the group's activation groups j (hi, lo)
  auto act_at = [&](int u) {
    return [&xp, u](int, int j, uint4& hi, uint4& lo) {
      hi = __ldg(xp + 32 * u + 2 * j);
      lo = __ldg(xp + 32 * u + 2 * j + 1);
    };
  };
  // the group's MMAs (blocks b .. b + U - 1 before bhi), then xp past them
  auto mma_group = [&](const WBlk(&wr)[U][RT], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b + u >= bhi) break;  // warp-uniform
      block_mma_with<RT, 1, decltype(act_at(0)), WBlk, AG>(wr[u], act_at(u), chain);
    }
    xp += 32 * U;
  };
  // groups 0 .. NG - 2 issued; then group k + NG - 1 is issued before group k is multiplied (the
  // loops written out: through mma::walk_two_groups / walk_groups ptxas spilled here, 3x1a2 528 /
  // 516 B against 88 / 160 written out, 2026-12-07; the measured build is this one)
  static_assert(NG == 2 || NG == 3, "two or three groups");
  WBlk wa[U][RT], wb[U][RT];
  load_group(wa, blo);
  if constexpr (NG == 2) {
    for (int b = blo; b < bhi; b += 2 * U) {
      if (b + U < bhi) load_group(wb, b + U);
      mma_group(wa, b);
      if (b + U >= bhi) break;
      if (b + 2 * U < bhi) load_group(wa, b + 2 * U);
      mma_group(wb, b + U);
    }
  } else {
    WBlk wc[U][RT];
    if (blo + U < bhi) load_group(wb, blo + U);
    for (int b = blo; b < bhi; b += 3 * U) {
      if (b + 2 * U < bhi) load_group(wc, b + 2 * U);
      mma_group(wa, b);
      if (b + U >= bhi) break;
      if (b + 3 * U < bhi) load_group(wa, b + 3 * U);
      mma_group(wb, b + U);
      if (b + 2 * U >= bhi) break;
      if (b + 4 * U < bhi) load_group(wb, b + 4 * U);
      mma_group(wc, b + 2 * U);
    }
  }
}

// Staged decode chain (wide mode, one token tile): the same blocks, block sums and chain sum as
// chain_sum (the same bits), but the weights reach the registers through a ring of S stages of
// shared memory private to the warp, filled with cp.async S - 1 blocks ahead of the MMAs: more
// bytes in flight than registers allow, and no registers held by loads in flight. Stage layout:
// codes [RT][2][32 lanes][16 B] (each lane reads back only what it copied), then the 4 scale bytes
// of each of the tile's 16 RT rows (row r = rt*16 + 8h + g copied by lane r, read by its 4 lanes:
// a __syncwarp after the waits). Needs 4-byte aligned scale rows (sld % 4 == 0).
template <int RT, int S>
__device__ __forceinline__ void chain_sum_staged(const MoeMmaParams& p, const uint8_t* codes, const uint8_t* scales,
                                                 int n0, const uint16_t* const (&xr)[1], const bool (&tok)[1],
                                                 int blo, int bhi, int lane, uint8_t* ring, float (&chain)[RT][1][4]) {
  static_assert(S >= 2, "at least two stages");
  constexpr int kCode = moe_staged_code_bytes(RT), kStage = moe_staged_stage_bytes(RT);
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = (p.K + 31) / 32;
  const uint8_t* crow[RT][2];
  bool rok[RT][2];
  mma::tile_rows<RT>(codes, p.ld, n0, g, p.N, crow, rok);
  // the scale row this lane copies: tile row `lane` (lanes below 16 RT)
  const bool srow_ok = lane < 16 * RT && n0 + lane < p.N;
  const uint8_t* srow = scales + int64_t(srow_ok ? n0 + lane : 0) * p.sld;
  mma::zero<RT, 1>(chain);

  // block b into stage `st` (nothing past bhi); one commit group per call either way
  auto issue = [&](int b, int st) {
    uint8_t* dst = ring + st * kStage;
    if (b < bhi) {
      const int c = 4 * b + t;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = rok[rt][h] && c < nchunks;
          cp_async_16(dst + ((rt * 2 + h) * 32 + lane) * 16, crow[rt][h] + (ok ? int64_t(c) * 16 : 0), ok ? 16 : 0);
        }
      if (lane < 16 * RT) {
        const int have = srow_ok ? min(4, nchunks - 4 * b) : 0;
        cp_async_4(dst + kCode + lane * 4, srow + (have > 0 ? 4 * b : 0), have > 0 ? have : 0);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(blo + s, s);
  int st = 0;
  for (int b = blo; b < bhi; ++b) {
    issue(b + S - 1, st == 0 ? S - 1 : st - 1);  // the stage of block b - 1, read last iteration
    cp_async_wait<S - 1>();
    __syncwarp();
    const uint8_t* src = ring + st * kStage;
    const bool live = 4 * b + t < nchunks;
    WBlk wr[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wr[rt].v[h] = *reinterpret_cast<const uint4*>(src + ((rt * 2 + h) * 32 + lane) * 16);
        const uint32_t sb = src[kCode + (rt * 16 + 8 * h + g) * 4 + t];
        wr[rt].m[h] = scale_mult(live && rok[rt][h] ? sb : 127u);
      }
    __syncwarp();  // every lane has read the stage's scales before its copier refills it
    const int kc = b * kMoeKBlock + 32 * t;
    if ((b + 1) * kMoeKBlock <= p.K) block_mma<RT, 1, true>(wr, xr, tok, kc, p.K, chain);
    else block_mma<RT, 1, false>(wr, xr, tok, kc, p.K, chain);
    st = st + 1 == S ? 0 : st + 1;
  }
}


// Staged-tile decode chain (the mono kernel, moe_stage_tile): the same blocks, block sums and chain
// sum as chain_sum (the same bits), the codes and scales read from the item's tile in shared
// memory (row r of the tile: codes at r * moe_staged_code_stride(ld), scales at
// 16 RT moe_staged_code_stride(ld) + r * sld).
template <int RT>
__device__ __forceinline__ void chain_sum_tile(const MoeMmaParams& p, const uint8_t* tile, int n0,
                                               const uint16_t* const (&xr)[1], const bool (&tok)[1], int blo, int bhi,
                                               int lane, float (&chain)[RT][1][4]) {
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = (p.K + 31) / 32;
  const int64_t cs = moe_staged_code_stride(p.ld);
  const uint8_t* stile = tile + 16 * RT * cs;
  bool rok[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) rok[rt][h] = n0 + rt * 16 + g + 8 * h < p.N;
  mma::zero<RT, 1>(chain);
#pragma unroll 2
  for (int b = blo; b < bhi; ++b) {
    const int c = 4 * b + t;
    const bool live = c < nchunks;
    WBlk wr[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rt * 16 + g + 8 * h;
        const bool ok = live && rok[rt][h];
        wr[rt].v[h] = ok ? mma::ld_shared_16(tile + r * cs + int64_t(c) * 16) : make_uint4(0, 0, 0, 0);
        wr[rt].m[h] = scale_mult(ok ? uint32_t(stile[r * p.sld + c]) : 127u);
      }
    const int kc = b * kMoeKBlock + 32 * t;
    if ((b + 1) * kMoeKBlock <= p.K) block_mma<RT, 1, true>(wr, xr, tok, kc, p.K, chain);
    else block_mma<RT, 1, false>(wr, xr, tok, kc, p.K, chain);
  }
}

// Activation rows of the token tile starting at pair t0 of an entry ending at `end`.
template <int NT>
__device__ __forceinline__ void tile_tokens(const MoeMmaParams& p, int t0, int end, int g, const uint16_t* (&xr)[NT],
                                            bool (&tok)[NT]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int pp = t0 + nt * 8 + g;
    tok[nt] = pp < end;
    const int row = tok[nt] ? (p.pair_row ? p.pair_row[pp] : pp) : 0;
    xr[nt] = p.xs + int64_t(row) * p.ld_xs;
  }
}

}  // namespace moe_mma

// ---- wide mode: item = (row tile, entry), warp j of the group = chain j ----
// smem: mma_wide_smem_floats(RT, NT, p.chains) floats. The group has at least p.chains warps
// (warps past the chains only help with the epilogue). Synchronizes the group (every thread of it
// must call it with the same tile_n and entry).
// S > 0 (NT == 1 only): the staged chain with S stages per warp; `ring` then holds
// P * moe_wide_ring_bytes(RT, S) bytes (16-byte aligned), warp w's ring at w * that.
// NG > 0 (S == 0, NT == 1, MXFP4): whole items on chain_sum_whole with NG groups of UW blocks, the
// activations AG groups at a time.
template <int RT, int NT, int U = moe_mma::blocks_in_flight<RT, NT>(), int S = 0, class B = moe_mma::WBlk, int NG = 0,
          int UW = 1, int AG = 4>
__device__ __forceinline__ void moe_mma_wide_work(const MoeMmaParams& p, int tile_n, int entry, Group g, float* smem,
                                                  uint8_t* ring = nullptr) {
  static_assert(S == 0 || NT == 1, "the staged chain is for one token tile");
  static_assert(S == 0 || std::is_same_v<B, moe_mma::WBlk>, "the staged ring holds MXFP4 runs");
  if (entry >= *p.num_entries) return;  // uniform over the group
  const int lane = g.lane(), warp = g.warp(), P = p.chains;
  const int gl = lane >> 2;
  const int slot = p.entry_slot[entry];
  const int begin = p.entry_begin[entry], end = p.entry_begin[entry + 1];
  const uint8_t* codes = p.codes + int64_t(slot) * p.slot_codes;
  const uint8_t* scales = p.scales + int64_t(slot) * p.slot_scales;
  const int n0 = tile_n * 16 * RT;
  const int blocks = (p.K + kMoeKBlock - 1) / kMoeKBlock;
  for (int t0 = begin; t0 < end; t0 += 8 * NT) {
    if (warp < P) {
      const uint16_t* xr[NT];
      bool tok[NT];
      moe_mma::tile_tokens<NT>(p, t0, end, gl, xr, tok);
      float chain[RT][NT][4];
      if constexpr (S > 0) {
        moe_mma::chain_sum_staged<RT, S>(p, codes, scales, n0, xr, tok, mma::chain_begin(warp, blocks, P),
                                         mma::chain_begin(warp + 1, blocks, P), lane,
                                         ring + warp * moe_wide_ring_bytes(RT, S), chain);
      } else if constexpr (NG > 0) {
        static_assert(NT == 1 && std::is_same_v<B, moe_mma::WBlk>, "whole items: one token tile of MXFP4 runs");
        if (p.K % kMoeKBlock == 0 && n0 + 16 * RT <= p.N)  // a whole item (uniform over the group)
          moe_mma::chain_sum_whole<RT, NG, UW, AG>(p, codes, scales, n0, xr[0], mma::chain_begin(warp, blocks, P),
                                               mma::chain_begin(warp + 1, blocks, P), lane, chain);
        else
          moe_mma::chain_sum<RT, NT, U, B>(p, codes, scales, n0, xr, tok, mma::chain_begin(warp, blocks, P),
                                           mma::chain_begin(warp + 1, blocks, P), lane, chain);
      } else {
        moe_mma::chain_sum<RT, NT, U, B>(p, codes, scales, n0, xr, tok, mma::chain_begin(warp, blocks, P),
                                         mma::chain_begin(warp + 1, blocks, P), lane, chain);
      }
      mma::store_partials<RT, NT>(chain, warp, lane, smem);
    }
    g.sync();
    mma::wide_epilogue<RT, NT>(
        smem, P, n0, t0, p.N, end, p.swiglu != 0, p.alpha, p.limit, g, [](int, int, float tot) { return tot; },
        [&](int pp, int col, float v) {
          p.y[int64_t(pp) * p.ld_y + col] = v;
          if (p.ys) moe_mma::store_split(p.ys + int64_t(pp) * p.ld_ys, col, v);
        });
    g.sync();  // the next token tile reuses smem
  }
}

// ---- staged wide items (the mono kernel): the item's tile copied to shared memory ahead of it ----
// One thread: arms `bar` with item w's tile (moe_staged_* in moe_params.h; the op's moe_can_stage)
// and copies it into `tile` (16-byte aligned). An item whose entry does not exist in this step
// copies nothing (its barrier completes at once). Reads the routing (entry_slot, num_entries): the
// caller must have acquired its producer's completion.
__device__ __forceinline__ void moe_stage_tile(const MoeMmaParams& p, int64_t w, uint8_t* tile, uint64_t* bar) {
  constexpr int kRows = 16 * kMoeWideRT;
  const int tiles = moe_row_tiles(p);
  const int entry = p.max_entries - 1 - int(w / tiles);
  if (entry >= *p.num_entries) {
    mbar_expect_tx(bar, 0);
    return;
  }
  const int slot = p.entry_slot[entry], n0 = int(w % tiles) * kRows;
  const uint8_t* codes = p.codes + int64_t(slot) * p.slot_codes + int64_t(n0) * p.ld;
  const int64_t cs = moe_staged_code_stride(p.ld);
  const uint32_t sbytes = uint32_t(kRows * p.sld);
  mbar_expect_tx(bar, uint32_t(kRows * p.ld) + sbytes);
  for (int r = 0; r < kRows; ++r) bulk_g2s(tile + r * cs, codes + int64_t(r) * p.ld, uint32_t(p.ld), bar);
  bulk_g2s(tile + kRows * cs, p.scales + int64_t(slot) * p.slot_scales + int64_t(n0) * p.sld, sbytes, bar);
}

// Item w of the wide op (MoeWideOp) from its staged tile (complete: its barrier waited on by every
// thread of the group); the same bits as moe_mma_wide_work.
__device__ __forceinline__ void moe_mma_staged_item(const MoeMmaParams& p, int64_t w, Group g, uint8_t* smem,
                                                    const uint8_t* tile) {
  constexpr int RT = kMoeWideRT;
  const int tiles = moe_row_tiles(p);
  const int entry = p.max_entries - 1 - int(w / tiles);
  if (entry >= *p.num_entries) return;  // uniform over the group
  const int lane = g.lane(), warp = g.warp(), P = p.chains;
  const int begin = p.entry_begin[entry], end = p.entry_begin[entry + 1];
  const int n0 = int(w % tiles) * 16 * RT;
  const int blocks = (p.K + kMoeKBlock - 1) / kMoeKBlock;
  float* part = reinterpret_cast<float*>(smem);
  for (int t0 = begin; t0 < end; t0 += 8) {
    if (warp < P) {
      const uint16_t* xr[1];
      bool tok[1];
      moe_mma::tile_tokens<1>(p, t0, end, lane >> 2, xr, tok);
      float chain[RT][1][4];
      moe_mma::chain_sum_tile<RT>(p, tile, n0, xr, tok, mma::chain_begin(warp, blocks, P),
                                  mma::chain_begin(warp + 1, blocks, P), lane, chain);
      mma::store_partials<RT, 1>(chain, warp, lane, part);
    }
    g.sync();
    mma::wide_epilogue<RT, 1>(
        part, P, n0, t0, p.N, end, p.swiglu != 0, p.alpha, p.limit, g, [](int, int, float tot) { return tot; },
        [&](int pp, int col, float v) {
          p.y[int64_t(pp) * p.ld_y + col] = v;
          if (p.ys) moe_mma::store_split(p.ys + int64_t(pp) * p.ld_ys, col, v);
        });
    g.sync();  // the next token tile reuses smem
  }
}

// ---- deep mode: CTA tiles through a shared-memory ring, persistent over the tile list ----
// CTA tile = (entry, token tile of kMoeDeepTokens pairs, row group of kMoeDeepRows rows); the list
// in entry order, then token tile, then row group (fastest). CTA w takes tiles w, w + workers, ...
// Its steps (tile, K block b) run through a ring of kMoeDeepStages stages that all threads fill
// with cp.async kMoeDeepStages - 1 steps ahead (across tile boundaries): the block's activations
// of the tile's pairs (zero for padding pairs and for groups at or past K) and its weight codes
// (zero past N and past the row's chunks). Warp w of the CTA owns the warp tile of rows
// 32 (w % kMoeDeepRowGroups) and pairs 32 (w / kMoeDeepRowGroups) of the CTA tile and walks its
// chains exactly as chain_sum does (the same blocks, block sums from +0 and chain sums), chains
// 0..P-2 into its running total (add_running), then deep_epilogue: the bits of every other walk.
// Scale bytes are read by the lanes from global memory, one block ahead.
namespace moe_mma {

// Where the walk stands in the tile list (entry a, whose first tile is number `base`).
struct DeepWalk {
  int a = 0, base = 0, begin = 0, end = 0, tok_tiles = 0;

  __device__ __forceinline__ void start(const MoeMmaParams& p, int num) {
    if (num > 0) {
      begin = p.entry_begin[0];
      end = p.entry_begin[1];
      tok_tiles = (end - begin + kMoeDeepTokens - 1) / kMoeDeepTokens;
    }
  }
  // Tile i (at or after the last one sought): false past the list; else its entry, first pair t0
  // and first row n0.
  __device__ __forceinline__ bool seek(const MoeMmaParams& p, int num, int groups, int i, int& t0, int& n0) {
    while (a < num && i >= base + groups * tok_tiles) {
      base += groups * tok_tiles;
      if (++a < num) {
        begin = end;
        end = p.entry_begin[a + 1];
        tok_tiles = (end - begin + kMoeDeepTokens - 1) / kMoeDeepTokens;
      }
    }
    if (a >= num) return false;
    const int local = i - base;
    t0 = begin + local / groups * kMoeDeepTokens;
    n0 = local % groups * kMoeDeepRows;
    return true;
  }
};

// The physical 16-byte chunk of chunk c (0..31: group c / 2 of the block, hi for even c) in an
// activation row of the ring: c ^ (2 (c / 8) + (row & 1)) within its 8-chunk run. A quarter warp
// (lanes g in {2m, 2m + 1}, t = 0..3, one group j) then reads 8 distinct bank groups.
__device__ __forceinline__ int deep_chunk(int row, int c) { return c ^ ((((c >> 3) << 1) | (row & 1)) & 7); }

// The physical 16-byte chunk of an MXFP8 code row's chunk c (0..7) in the ring: c ^ (row & 1), so
// that a quarter warp (rows g, g + 1 at 128-byte strides, lanes t at 32-byte offsets) reads 8
// distinct bank groups.
__device__ __forceinline__ int deep_chunk8(int row, int c) { return c ^ (row & 1); }

// What one thread of the CTA copies into the ring for the producer's current tile: activation
// chunk c = tid % 32 of the tile's pairs tid / 32 + 8 r (r = 0..7; their rows' offsets, -1 for
// padding pairs, set once per tile), code chunk tid % 4 of rows tid / 4 and tid / 4 + 64 (FP8:
// chunk tid % 8 of rows tid / 8 + 32 r, r = 0..3: a block is 128 bytes of a row).
template <bool FP8>
struct DeepFeed {
  static constexpr int kChunks = FP8 ? 8 : 4;  // 16-byte code chunks of a row a block
  static constexpr int kThreads = 32 * kMoeDeepWarps, kActRows = kMoeDeepTokens * 32 / kThreads,
                       kCodeRows = kMoeDeepRows * kChunks / kThreads;
  int64_t xoff[kActRows];  // uint16 offset of the row's chunk c in p.xs, -1: padding
  const uint8_t* codes = nullptr;
  int n0 = 0;

  __device__ __forceinline__ void tile(const MoeMmaParams& p, int slot, int t0, int end, int tile_n0, int tid) {
    const int c = tid & 31;
#pragma unroll
    for (int r = 0; r < kActRows; ++r) {
      const int pp = t0 + tid / 32 + r * (kThreads / 32);
      xoff[r] = pp < end ? int64_t(p.pair_row ? p.pair_row[pp] : pp) * p.ld_xs + 8 * c : -1;
    }
    codes = p.codes + int64_t(slot) * p.slot_codes;
    n0 = tile_n0;
  }
  // Block b of the tile into stage `st` (zeros for padding pairs, groups at or past K, rows past N
  // and chunks past the row's).
  __device__ __forceinline__ void issue(const MoeMmaParams& p, int b, uint8_t* st, int tid) const {
    const int c = tid & 31;
    const bool kok = 8 * (16 * b + (c >> 1)) < p.K;
#pragma unroll
    for (int r = 0; r < kActRows; ++r) {
      const int row = tid / 32 + r * (kThreads / 32);
      const bool ok = kok && xoff[r] >= 0;
      cp_async_16(st + row * 512 + deep_chunk(row, c) * 16, ok ? p.xs + xoff[r] + 256 * int64_t(b) : p.xs,
                  ok ? 16 : 0);
    }
    const int nchunks = (p.K + 31) / 32;
    uint8_t* cst = st + kMoeDeepActBytes;
    if constexpr (FP8) {  // 16-byte chunk c8 of row q / 8: half c8 % 2 of 32-element chunk 4b + c8 / 2
      const int c8 = tid & 7, cc = 4 * b + (c8 >> 1);
#pragma unroll
      for (int r = 0; r < kCodeRows; ++r) {
        const int q = tid + r * kThreads, row = q >> 3, n = n0 + row;
        const bool ok = n < p.N && cc < nchunks;
        cp_async_16(cst + row * 128 + deep_chunk8(row, c8) * 16,
                    ok ? codes + int64_t(n) * p.ld + 128 * int64_t(b) + 16 * c8 : p.codes, ok ? 16 : 0);
      }
    } else {
      const int cc = 4 * b + (tid & 3);
#pragma unroll
      for (int r = 0; r < kCodeRows; ++r) {
        const int q = tid + r * kThreads, n = n0 + (q >> 2);
        const bool ok = n < p.N && cc < nchunks;
        cp_async_16(cst + q * 16, ok ? codes + int64_t(n) * p.ld + 16 * int64_t(cc) : p.codes, ok ? 16 : 0);
      }
    }
  }
};

}  // namespace moe_mma

// FP8: MXFP8 experts (p.fp8), the codes of a block 128 bytes a row in the ring, read as WBlk8 runs.
template <bool FP8 = false>
__device__ __forceinline__ void moe_mma_deep_work(const MoeMmaParams& p, int worker, Group g, uint8_t* smem) {
  constexpr int RT = kMoeDeepRT, NT = kMoeDeepNT, S = kMoeDeepStages, kStage = moe_deep_stage_bytes(FP8);
  const int num = *p.num_entries;
  const int groups = moe_deep_row_groups(p), P = p.chains;
  const int blocks = (p.K + kMoeKBlock - 1) / kMoeKBlock, nchunks = (p.K + 31) / 32;
  const int lane = g.lane(), warp = g.warp(), gl = lane >> 2, t = lane & 3;
  const int wr0 = 16 * RT * (warp % kMoeDeepRowGroups), wt0 = 8 * NT * (warp / kMoeDeepRowGroups);
  float* wsmem = reinterpret_cast<float*>(smem + S * kStage) +
                 warp * mma_deep_smem_floats_per_warp(RT, NT);

  // producer: the next step to issue (tile ip, block bp)
  moe_mma::DeepWalk pw;
  moe_mma::DeepFeed<FP8> feed;
  pw.start(p, num);
  int ip = worker, bp = 0;
  auto seek_feed = [&] {
    int t0, n0;
    const bool more = pw.seek(p, num, groups, ip, t0, n0);
    if (more) feed.tile(p, p.entry_slot[pw.a], t0, pw.end, n0, g.tid);
    return more;
  };
  bool pmore = seek_feed();
  auto issue_next = [&](int stage) {
    if (pmore) {
      feed.issue(p, bp, smem + stage * kStage, g.tid);
      if (++bp == blocks) {
        bp = 0;
        ip += p.workers;
        pmore = seek_feed();
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue_next(s);

  // consumer
  moe_mma::DeepWalk cw;
  cw.start(p, num);
  int stage = 0;
  for (int i = worker;; i += p.workers) {
    int t0, n0;
    if (!cw.seek(p, num, groups, i, t0, n0)) break;  // uniform over the CTA
    const int end = cw.end, slot = p.entry_slot[cw.a];
    const uint8_t* scales = p.scales + int64_t(slot) * p.slot_scales;
    // the lane's scale rows (rows past N read row 0 and are masked)
    const uint8_t* srow[RT][2];
    bool rok[RT][2];
    mma::tile_rows<RT>(scales, p.sld, n0 + wr0, gl, p.N, srow, rok);
    auto scale_bytes = [&](int b, uint32_t(&sb)[RT][2]) {
      const int c = 4 * b + t;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) sb[rt][h] = rok[rt][h] && c < nchunks ? uint32_t(__ldg(srow[rt][h] + c)) : 127u;
    };
    uint32_t sb[RT][2];
    scale_bytes(0, sb);
    float chain[RT][NT][4];
    mma::zero<RT, NT>(chain);
    int j = 0, chain_end = mma::chain_begin(1, blocks, P);
    for (int b = 0; b < blocks; ++b) {
      cp_async_wait<S - 2>();
      g.sync();  // step (i, b) is in `stage` for every thread; stage - 1 is free again
      issue_next(stage == 0 ? S - 1 : stage - 1);
      uint32_t sn[RT][2];
      if (b + 1 < blocks) scale_bytes(b + 1, sn);
      const uint8_t* st = smem + stage * kStage;
      const uint8_t* cst = st + kMoeDeepActBytes;
      std::conditional_t<FP8, moe_mma::WBlk8, moe_mma::WBlk> wr[RT];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        if constexpr (FP8) wr[rt].m = sb[rt][0] | sb[rt][1] << 16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = wr0 + rt * 16 + 8 * h + gl;
          if constexpr (FP8) {  // the lane's 32 bytes: chunks 2t and 2t + 1 of the row
            wr[rt].v[h][0] = mma::ld_shared_16(cst + row * 128 + moe_mma::deep_chunk8(row, 2 * t) * 16);
            wr[rt].v[h][1] = mma::ld_shared_16(cst + row * 128 + moe_mma::deep_chunk8(row, 2 * t + 1) * 16);
          } else {
            wr[rt].v[h] = mma::ld_shared_16(cst + row * 64 + 16 * t);
            wr[rt].m[h] = moe_mma::scale_mult(sb[rt][h]);
          }
        }
      }
      const int kc = b * kMoeKBlock + 32 * t;
      auto act = [&](int nt, int jj, uint4& hi, uint4& lo) {
        const int row = wt0 + 8 * nt + gl, c = 8 * t + 2 * jj;
        const uint8_t* r = st + row * 512;
        hi = mma::ld_shared_16(r + moe_mma::deep_chunk(row, c) * 16);
        lo = mma::ld_shared_16(r + moe_mma::deep_chunk(row, c + 1) * 16);
      };
      if ((b + 1) * kMoeKBlock <= p.K) {
        moe_mma::block_mma_with<RT, NT>(wr, act, chain);
      } else {
        moe_mma::block_mma_with<RT, NT>(
            wr,
            [&](int nt, int jj, uint4& hi, uint4& lo) {
              act(nt, jj, hi, lo);
              moe_mma::mask_past_k(kc + 8 * jj, p.K, hi, lo);
            },
            chain);
      }
      if (b + 1 < blocks) {
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
          for (int h = 0; h < 2; ++h) sb[rt][h] = sn[rt][h];
      }
      stage = stage + 1 == S ? 0 : stage + 1;
      if (b + 1 == chain_end && j + 1 < P) {  // chain j done: into the running total, the next from +0
        mma::add_running<RT, NT>(wsmem, chain, j, lane);
        mma::zero<RT, NT>(chain);
        chain_end = mma::chain_begin(++j + 1, blocks, P);
      }
    }
    mma::deep_epilogue<RT, NT>(
        wsmem, chain, P, n0 + wr0, t0 + wt0, p.N, end, p.swiglu != 0, p.alpha, p.limit, lane,
        [](int, int, float tot) { return tot; },
        [&](int pp, int col, float v) {
          p.y[int64_t(pp) * p.ld_y + col] = v;
          if (p.ys) moe_mma::store_split(p.ys + int64_t(pp) * p.ld_ys, col, v);
        });
  }
  cp_async_wait<0>();
}

// ---- the split of fp32 activations (the header's layout) ----
// Work item (row, group G): xs[row] group G from x[row][8G .. 8G + 7]; groups up to ld_xs / 16.
// With the norm's halves (p.nin), x is the prep half's z and the split is of z * inv (the
// normalized row: the experts then need no inv); inv: the row's, computed by the item (norm_inv_rows)
// or handed in.
__device__ __forceinline__ void moe_split_work(const MoeSplitParams& p, int row, int G, float inv) {
  uint4 hi, lo;
  moe_mma::split_group(p.x + int64_t(row) * p.ld_x, 8 * G, p.K, hi, lo, inv);
  uint4* d = reinterpret_cast<uint4*>(p.xs + int64_t(row) * p.ld_xs + 16 * int64_t(G));
  d[0] = hi;
  d[1] = lo;
}

// ---- the ops (moe_params.h shapes) ----
struct MoeSplitOp : OpBounds<kMoeSplitThreads> {
  using Params = MoeSplitParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    const int64_t slices = ceil_div(p.ld_xs / 16, kMoeSplitThreads);
    const int G = int(w % slices) * kMoeSplitThreads + g.tid, row = int(w / slices);
    float inv = 1.f;
    if (p.nin.ss) {  // the row's inv from the chunk sums, by warp 0, shared through smem
      float* s = reinterpret_cast<float*>(smem);
      if (g.warp() == 0) {
        const int C = norm_chunks(p.nin.n);
        const float v = norm_inv_warp(p.nin.ss + int64_t(row) * C, C, p.nin.n, p.nin.eps, g.lane());
        if (g.lane() == 0) s[0] = v;
      }
      g.sync();
      inv = s[0];
      g.sync();  // smem is reused by the group's next item
    } else if (p.nin.inv) {
      inv = p.nin.inv[row];
    }
    if (G < p.ld_xs / 16) moe_split_work(p, row, G, inv);
  }
};

// Wide: S > 0 the staged ring (p.stages == S), else the register pipeline of U blocks per group;
// NG > 0 (S == 0): whole items on chain_sum_whole, NG register groups of UW blocks, the
// activations AG groups at a time (native's
// M3_MOE_WALK, an experiment; the mono kernel runs NG = 0).
template <int S, int NG = 0, int UW = 1, int AG = 4>
struct MoeWideOp : OpBounds<32 * kMoeMaxChains> {
  static_assert(S == 0 || NG == 0, "the staged ring or the whole walk");
  using Params = MoeMmaParams;
  static constexpr int kU = S > 0 ? 1 : moe_mma::blocks_in_flight<kMoeWideRT, kMoeWideNT>();
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    const int tiles = moe_row_tiles(p);
    const int entry = p.max_entries - 1 - int(w / tiles);
    uint8_t* ring = S > 0 ? smem + moe_wide_partials_bytes(p.chains) : nullptr;
    moe_mma_wide_work<kMoeWideRT, kMoeWideNT, kU, S, moe_mma::WBlk, NG, UW, AG>(p, int(w % tiles), entry, g,
                                                                                 reinterpret_cast<float*>(smem), ring);
  }
  // The same item from its staged tile (moe_stage_tile); the same bits.
  __device__ static void run_staged(const Params& p, int64_t w, Group g, uint8_t* smem, const uint8_t* tile) {
    moe_mma_staged_item(p, w, g, smem, tile);
  }
};

// Wide over MXFP8 experts (p.fp8): the register pipeline, one block per group (a run is 32 bytes a
// row); the same blocks, chains and bits as any walk of the same values.
struct MoeWideFp8Op : OpBounds<32 * kMoeMaxChains> {
  using Params = MoeMmaParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    const int tiles = moe_row_tiles(p);
    const int entry = p.max_entries - 1 - int(w / tiles);
    moe_mma_wide_work<kMoeWideRT, kMoeWideNT, 1, 0, moe_mma::WBlk8>(p, int(w % tiles), entry, g,
                                                                   reinterpret_cast<float*>(smem));
  }
};

// Deep: one persistent CTA per SM (the grid is one wave: workers = SMs).
struct MoeDeepOp : OpBounds<32 * kMoeDeepWarps, 1> {
  using Params = MoeMmaParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) { moe_mma_deep_work(p, int(w), g, smem); }
};
// Deep over MXFP8 experts (p.fp8): the same tiles, chains and bits, 128-byte code rows in the ring.
struct MoeDeepFp8Op : OpBounds<32 * kMoeDeepWarps, 1> {
  using Params = MoeMmaParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    moe_mma_deep_work<true>(p, int(w), g, smem);
  }
};

}  // namespace m3::kernels
