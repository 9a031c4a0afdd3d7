// What the batch-invariant tensor-core kernels (mma_linear.cuh: FP8 / BF16 linear layers,
// moe_mma.cuh: MXFP4 experts) share: the bf16 MMA and operand helpers, the chain split of K, and
// the two ways chain sums meet in their fixed order (the invariance contract of both headers):
//   wide mode: warp j of a CTA holds chain j's sums; they go to shared memory as
//     part[j][rt][column][row 0..15] (columns padded to 17 floats) and a row total is
//     chain 0 + chain 1 + ... + chain P-1, left to right (ordered_total);
//   deep mode: one warp walks the chains one after another; chains 0..j-1 are summed left to right
//     into a per-warp running total in shared memory (add_running), the last chain is added from
//     registers (running_total).
// Accumulator fragment layout (mma.sync m16n8k16, swap-AB): chain[rt][nt][i] is row
// rt*16 + g + 8*(i >> 1), column (token) nt*8 + 2t + (i & 1) of the warp's tile; g = lane / 4,
// t = lane % 4.
#pragma once
#include <cstdint>

#include "kernels/act_split.cuh"
#include "kernels/group.cuh"
#include "kernels/mma_params.h"
#include "kernels/swiglu.cuh"

namespace m3::kernels::mma {

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Four E4M3 codes (bytes of w, element i in byte i) -> bf16x2 {e0, e1} and {e2, e3}, exact.
// Code c = s eeee mmm; the bf16 pattern of its value * 2^-120 has low byte (c & 0x0f) << 4 (e0 m2 m1
// m0 0000) and high byte (c & 0x80) | (c >> 4 & 0x07) (s 0000 e3 e2 e1): two masks per word build
// all four low / high bytes, two byte permutes interleave them, one bf16x2 multiply per pair.
// mul: the bf16x2 multiplier, 2^120 for plain E4M3 values; an MXFP8 block scale 2^(S - 127) folds in
// as 2^(S - 7) (mx_mul), exact while the products stay normal or bf16-subnormal.
constexpr uint32_t kTwo120 = 0x7b807b80u;  // bf16x2 {2^120, 2^120}
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t w, uint32_t& lo, uint32_t& hi, uint32_t mul = kTwo120) {
  const uint32_t lb = (w << 4) & 0xf0f0f0f0u;
  const uint32_t hb = ((w >> 4) & 0x07070707u) | (w & 0x80808080u);
  lo = bf16x2_mul(__byte_perm(lb, hb, 0x5140), mul);
  hi = bf16x2_mul(__byte_perm(lb, hb, 0x7362), mul);
}
// Four 8x8 bf16 matrices from shared memory, transposed (ldmatrix .trans): lane i gives the
// address of row i % 8 of matrix i / 8 (16 bytes, 16-byte aligned); register j gets matrix j's
// elements (row 2t, column g) and (row 2t + 1, column g) (g = lane / 4, t = lane % 4): with rows
// = the k index, the B fragment (b0 or b1) of an m16n8k16 MMA.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// Rows n0 + rt*16 + g + 8h (a lane's rows of a warp's row tiles) of a [N][ld]-byte tensor: their
// starts, and whether they exist (rows at or past N point at row 0; callers mask them).
template <int RT>
__device__ __forceinline__ void tile_rows(const uint8_t* base, int64_t ld, int n0, int g, int N,
                                          const uint8_t* (&row)[RT][2], bool (&ok)[RT][2]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + rt * 16 + g + 8 * h;
      ok[rt][h] = n < N;
      row[rt][h] = base + int64_t(ok[rt][h] ? n : 0) * ld;
    }
}

// Accumulator fragments: all +0, and chain += blk element by element (one fp32 add each).
template <int RT, int NT>
__device__ __forceinline__ void zero(float (&f)[RT][NT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) f[rt][nt][i] = 0.f;
}
template <int RT, int NT>
__device__ __forceinline__ void add_into(float (&chain)[RT][NT][4], const float (&blk)[RT][NT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) chain[rt][nt][i] = __fadd_rn(chain[rt][nt][i], blk[rt][nt][i]);
}

// Chain j of P covers blocks [chain_begin(j), chain_begin(j + 1)) of `blocks`.
__device__ __forceinline__ int chain_begin(int j, int blocks, int P) { return int(int64_t(j) * blocks / P); }

// A register walk of blocks [blo, bhi) in groups of U blocks, two groups in registers (wa, wb):
// load(w, b) issues blocks b .. b + U - 1 (those before bhi) into w, mul(w, b) multiplies them in
// block order; each group's loads are issued before the previous group's MMAs, so one group is
// always in flight while the other is multiplied.
template <int U, class G, class Load, class Mul>
__device__ __forceinline__ void walk_two_groups(int blo, int bhi, G& wa, G& wb, Load load, Mul mul) {
  load(wa, blo);
  for (int b = blo; b < bhi; b += 2 * U) {
    if (b + U < bhi) load(wb, b + U);
    mul(wa, b);
    if (b + U >= bhi) break;
    if (b + 2 * U < bhi) load(wa, b + 2 * U);
    mul(wb, b + U);
  }
}

// The same walk with NG = 3 or 4 groups in registers (w[0 .. NG - 1]), NG - 1 of them in flight
// while one is multiplied: more bytes in flight for the same registers when U is smaller. Written
// out per NG (a generic ring of groups spilled where the written-out loop does not, ptxas
// 2026-12-07).
template <int NG, int U, class G, class Load, class Mul>
__device__ __forceinline__ void walk_groups(int blo, int bhi, G (&w)[NG], Load load, Mul mul) {
  static_assert(NG == 3 || NG == 4, "walk_two_groups for two");
  load(w[0], blo);
  if (blo + U < bhi) load(w[1], blo + U);
  if constexpr (NG == 4)
    if (blo + 2 * U < bhi) load(w[2], blo + 2 * U);
  for (int b = blo; b < bhi; b += NG * U) {
    if (b + (NG - 1) * U < bhi) load(w[NG - 1], b + (NG - 1) * U);
    mul(w[0], b);
    if (b + U >= bhi) break;
    if (b + NG * U < bhi) load(w[0], b + NG * U);
    mul(w[1], b + U);
    if (b + 2 * U >= bhi) break;
    if (b + (NG + 1) * U < bhi) load(w[1], b + (NG + 1) * U);
    mul(w[2], b + 2 * U);
    if constexpr (NG == 4) {
      if (b + 3 * U >= bhi) break;
      if (b + 6 * U < bhi) load(w[2], b + 6 * U);
      mul(w[3], b + 3 * U);
    }
  }
}

// ---- wide mode (shared memory: mma_wide_smem_floats(RT, NT, P) floats) ----

// Warp `warp`'s chain sums into part[warp] (the block must synchronize before ordered_total).
template <int RT, int NT>
__device__ __forceinline__ void store_partials(const float (&chain)[RT][NT][4], int warp, int lane, float* smem) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), c = nt * 8 + 2 * t + (i & 1);
        smem[((warp * RT + rt) * 8 * NT + c) * 17 + r] = chain[rt][nt][i];
      }
}

// Row r (0..15) of row tile rt, column c: chain 0 + chain 1 + ... + chain P-1.
template <int RT, int NT>
__device__ __forceinline__ float ordered_total(const float* smem, int P, int rt, int c, int r) {
  float tot = smem[(rt * 8 * NT + c) * 17 + r];
  for (int w = 1; w < P; ++w) tot = __fadd_rn(tot, smem[((w * RT + rt) * 8 * NT + c) * 17 + r]);
  return tot;
}

// ---- deep mode (shared memory per warp: mma_deep_smem_floats_per_warp(RT, NT) floats) ----

// After chain j (< P - 1): running = chain 0 (j == 0) or running + chain j.
template <int RT, int NT>
__device__ __forceinline__ void add_running(float* wsmem, const float (&chain)[RT][NT][4], int j, int lane) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float& r = wsmem[((rt * NT + nt) * 4 + i) * 32 + lane];
        r = j == 0 ? chain[rt][nt][i] : __fadd_rn(r, chain[rt][nt][i]);
      }
}

// The total of fragment (rt, nt, i): the running total of chains 0..P-2 plus the last chain.
template <int RT, int NT>
__device__ __forceinline__ float running_total(const float* wsmem, const float (&last)[RT][NT][4], int P, int rt,
                                               int nt, int i, int lane) {
  return P == 1 ? last[rt][nt][i] : __fadd_rn(wsmem[((rt * NT + nt) * 4 + i) * 32 + lane], last[rt][nt][i]);
}

// ---- the epilogues both kernels share ----
// A tile of rows n0 .. n0 + 16 RT - 1 and tokens t0 .. t0 + 8 NT - 1 (tokens at or past t_end and
// rows at or past N are not stored). value(n, token, total) turns row n's chain total for a token
// (column) into its output (a row scale, a fused norm's inv, or nothing); store(token, column, v) writes one output. With SwiGLU, rows 2j and
// 2j + 1 are gate j and up j: store(token, j + n0 / 2, swiglu_oai(gate, up)).

// Wide: the chain partials of P warps are in smem (store_partials, then the group synchronized);
// the group's threads split the tile's outputs (any thread may write any output: each output is
// the same ordered_total whoever computes it).
template <int RT, int NT, class Value, class Store>
__device__ __forceinline__ void wide_epilogue(const float* smem, int P, int n0, int t0, int N, int t_end, bool swiglu,
                                              float alpha, float limit, Group g, Value value, Store store) {
  auto total = [&](int rt, int c, int r) { return ordered_total<RT, NT>(smem, P, rt, c, r); };
  if (!swiglu) {
    for (int o = g.tid; o < RT * 16 * 8 * NT; o += g.nthreads) {
      const int r = o % (16 * RT), c = o / (16 * RT), n = n0 + r, tk = t0 + c;
      if (n < N && tk < t_end) store(tk, n, value(n, tk, total(r >> 4, c, r & 15)));
    }
  } else {
    for (int o = g.tid; o < RT * 8 * 8 * NT; o += g.nthreads) {
      const int j = o % (8 * RT), c = o / (8 * RT), r = 2 * j, n = n0 + r, tk = t0 + c;
      if (n + 1 < N && tk < t_end) {
        const float gate = value(n, tk, total(r >> 4, c, r & 15));
        const float up = value(n + 1, tk, total(r >> 4, c, (r & 15) + 1));
        store(tk, n / 2, swiglu_oai_f32(gate, up, alpha, limit));
      }
    }
  }
}

// Deep: one warp; the running total of chains 0 .. P-2 is in wsmem, the last chain in registers.
template <int RT, int NT, class Value, class Store>
__device__ __forceinline__ void deep_epilogue(const float* wsmem, const float (&last)[RT][NT][4], int P, int n0,
                                              int t0, int N, int t_end, bool swiglu, float alpha, float limit,
                                              int lane, Value value, Store store) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float tot = running_total<RT, NT>(wsmem, last, P, rt, nt, i, lane);
        const int n = n0 + rt * 16 + g + 8 * (i >> 1), tk = t0 + nt * 8 + 2 * t + (i & 1);
        v[i] = n < N ? value(n, tk, tot) : 0.f;
      }
      if (!swiglu) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + rt * 16 + g + 8 * (i >> 1), tk = t0 + nt * 8 + 2 * t + (i & 1);
          if (n < N && tk < t_end) store(tk, n, v[i]);
        }
      } else {
        float up[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) up[i] = __shfl_down_sync(0xffffffffu, v[i], 4);  // row + 1 = lane + 4
        if ((g & 1) == 0) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int n = n0 + rt * 16 + g + 8 * (i >> 1), tk = t0 + nt * 8 + 2 * t + (i & 1);
            if (n + 1 < N && tk < t_end) store(tk, n / 2, swiglu_oai_f32(v[i], up[i], alpha, limit));
          }
        }
      }
    }
}

}  // namespace m3::kernels::mma
