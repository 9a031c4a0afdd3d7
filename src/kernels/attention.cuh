// Paged attention over FP8/BF16 K/V caches, block-sparse (MSA) or dense causal, any number of
// tokens, split-K (flash-decoding) so small batches still fill the GPU.
//
// Math, for token t at position p and query head h of KV group g = h / G (G = H / KV):
//   keys J = { j <= p : j in a selected logical block of (t, g) }   (dense: all j <= p)
//   s_j = (q_h . K[j]) * k_scale / sqrt(D)      o_h = v_scale * sum_j softmax(s)_j V[j]
// with K/V decoded from the cache (stored value x scale); products exact, sums and the softmax in
// fp32 (the dot products and p.V on tensor cores: attention_split_work).
//
// Key list of (t, g): the selected blocks in their order (ascending), bs keys each, key k ->
// block sel[k / bs], offset k % bs; keys past p (the local block's future, or a block beyond p)
// are masked. Dense: keys 0..p. The list is cut into 32-key tiles, and tiles into CHUNKS of
// `tiles_per_chunk` tiles (a constant of the backend, never of the batch).
//
// Batch invariance: the result of (t, g) is defined chunk by chunk, whatever the launch shape:
// each chunk c gets its own online-softmax state (m_c, l_c, acc_c) from a fresh start, and the
// chunks are folded in chunk order by attention_fold (prefix max M_c = max(M_{c-1}, m_c),
// a_c = e^{M_{c-1} - M_c}, b_c = e^{m_c - M_c}, L_c = L a_c + l_c b_c, A_c = A a_c + acc_c b_c,
// explicit roundings, no contraction), out = A * (v_scale / L). Two launch modes give the same
// bits: S == 1, one thread block per (t, g) walks all chunks and folds in registers (prefill,
// big batches, no workspace); S > 1, block s of (t, g) takes chunks s, s + S, ..., writes each
// chunk's state to the workspace, and attention_combine_work folds them in chunk order (small
// decode batches, to fill the GPU). So a row's output never depends on T, S or the other rows.
// Work item w = (t * KV + g) * S + s, a thread block of 8 warps (G <= 16 heads: the MMA rows).
// Tiles of K and V rows are copied into shared memory with cp.async, double-buffered (the next
// tile of the block's list loads while this one computes); per tile, q.k and p.V on tensor cores
// and the online softmax by warp reductions (see attention_split_work).
// Padding rows (position -1) produce zeros.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/act_split.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/attention_params.h"
#include "kernels/block_topk.cuh"
#include "kernels/mma_common.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {


// One fold step of the chunk states (see the header): from the running max Mprev and chunk max m,
// the new max and the two weights. Both launch modes call exactly this, so they round alike.
struct FoldWeights {
  float M, a, b;
};
__device__ __forceinline__ FoldWeights attention_fold_weights(float Mprev, float m) {
  const float M = fmaxf(Mprev, m);
  if (M == -INFINITY) return {M, 0.f, 0.f};  // nothing visible yet: stay empty
  return {M, expf(Mprev - M), expf(m - M)};  // Mprev = -inf -> a = 0; m = -inf -> b = 0
}
__device__ __forceinline__ float attention_fold(float run, float part, const FoldWeights& f) {
  return __fmaf_rn(run, f.a, __fmul_rn(part, f.b));
}
__device__ __forceinline__ float attention_out_scale(float L, float v_scale) {
  return L > 0.f ? __fdiv_rn(v_scale, L) : 0.f;
}

// The split item on tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulators; the 16 MMA
// rows are the group's heads, rows at or past G zero). Operands are exact or as exact as fp32:
// K and V elements are bf16 values exactly (E4M3 decoded by mma::e4m3x4_to_bf16x2, BF16 as
// stored; an E4M3 NaN code would read as +-480, and the cache encoder never writes one for a
// finite input); q and the probabilities p are split into three bf16 parts hi + mid + lo
// (mma::split_hi_mid_lo, |x - hi - mid - lo| <= 2^-26 |x| for normal x), each part multiplied (hi,
// mid, lo), so every product is exact and only the sums round (inside an MMA the tensor core's own
// deterministic fp32 accumulation, not necessarily round-to-nearest; between MMAs fp32 adds).
// Per tile:
//   q.k   warp w < 4 scores keys 8w .. 8w + 7 for the 16 rows. The head dimension is cut into
//         32-element blocks; in block b, lane t holds dims 32b + 8t .. + 7 of its key and step s
//         (0, 1) uses dims 32b + 8t + 4s + {0,1,2,3} as the step's columns {2t, 2t+1, 2t+8, 2t+9}
//         (q's fragments in the same order); a block's 6 MMAs accumulate from +0, the blocks are
//         added in order in fp32 (rounded), then times k_scale * softmax_scale.
//   V     warps 4-7 decode the FP8 V tile to bf16 meanwhile (BF16 tiles are read as they are).
//   soft  warp w: heads w and w + 8, lane = key, as before: the running max m, the tile's
//         p = e^(s - m) and rescale alpha = e^(m_old - m), l = l alpha + sum(p) (fp32, warp sums).
//   p.V   warp w: channels 8 (w + 8 i) .. + 7 of all heads: the tile's 2 steps x 3 parts of p
//         against V (ldmatrix .trans) accumulate from +0, then acc = fma(acc, alpha, tile sum).
// Chunks, the fold and the two launch modes are as described at the top of the file.
template <class C, int D>
__device__ void attention_split_work(const AttentionParams& p, int64_t w, Group grp, uint8_t* smem) {
  const int tid = grp.tid;
  static_assert(D == 64 || D == 128, "attention: head_dim must be 64 or 128");
  constexpr AttnSmemLayout Lay(D, C::kBytes);
  constexpr int kThreads = kAttnWarps * 32;
  constexpr int kCpr = D * C::kBytes / 16;  // 16-byte chunks per K/V row
  constexpr int kSteps = D / 16;            // q.k MMA steps
  constexpr int kNT = D / 64;               // p.V: 8-channel tiles per warp
  constexpr int kLd = AttnSmemLayout::kScoreLd;
  const int S = p.num_splits, KV = p.kv_heads, G = p.num_heads / p.kv_heads, bs = p.block_size;
  const ItemSplit ws = item_split(w, S), wg = item_split(ws.q, KV);
  const int s = ws.r, g = wg.r, t = int(wg.q);
  const int lane = tid & 31, warp = tid >> 5, fr = lane >> 2, fc = lane & 3;  // fragment row / column
  const int pos = p.positions[t];
  uint4* qfrag = reinterpret_cast<uint4*>(smem + Lay.qfrag);
  uint8_t* bufs = smem + Lay.bufs;
  uint8_t* vdec = smem + Lay.vdec;
  float* scores = reinterpret_cast<float*>(smem + Lay.scores);
  uint4* pfrag = reinterpret_cast<uint4*>(smem + Lay.pfrag);
  float* heads = reinterpret_cast<float*>(smem + Lay.heads);

  // The token's position, request and first 32 selected blocks are loaded together (none of the
  // three addresses depends on another's value; a padding row's entries are read and unused).
  // With topk_scores the item selects the blocks itself, into shared memory after everything else
  // (its scratch in the K/V buffers, before any tile is copied), split 0 writing them to `selected`.
  const int32_t* sel = p.selected ? p.selected + (int64_t(t) * KV + g) * p.topk : nullptr;
  const int32_t seq = p.token_seq[t];
  if (p.topk_scores) {
    int32_t* sel_s = reinterpret_cast<int32_t*>(smem + Lay.bytes);
    block_topk(p.topk_scores + (int64_t(t) * KV + g) * p.max_q_blocks, pos, bs, p.topk_local, p.topk, p.max_q_blocks,
               grp, bufs, sel_s);
    grp.sync();
    if (s == 0)
      for (int i = tid; i < p.topk; i += kThreads) p.selected[(int64_t(t) * KV + g) * p.topk + i] = sel_s[i];
    sel = sel_s;
  }
  const int32_t sel0 = sel && lane < p.topk ? sel[lane] : -1;
  const int32_t* table = nullptr;
  int NK = 0;
  if (pos >= 0) {
    table = p.block_tables + int64_t(seq) * p.table_width;
    if (sel) {
      // Count the selected blocks (ascending, -1 padded) with one ballot per 32 entries rather
      // than a chain of dependent loads.
      int n = __popc(__ballot_sync(kFullMask, sel0 >= 0));
      for (int i0 = 32; i0 < p.topk; i0 += 32) {
        const int i = i0 + lane;
        n += __popc(__ballot_sync(kFullMask, i < p.topk && sel[i] >= 0));
      }
      NK = n * bs;
    } else {
      NK = pos + 1;
    }
  } else {
    sel = nullptr;
  }
  const int n_tiles = (NK + kAttnTile - 1) / kAttnTile;
  const int P = p.tiles_per_chunk;
  const int n_chunks = (n_tiles + P - 1) / P;
  if (S > 1 && s == 0 && tid == 0) p.part_n[int64_t(t) * KV + g] = n_chunks;
  // This block's tiles: those of chunks s, s + S, ... in order. next_tile(-1) is the first.
  auto next_tile = [&](int tile) -> int {
    if (tile < 0) return s < n_chunks ? s * P : -1;
    const int c = tile / P;
    if (tile + 1 < min(n_tiles, (c + 1) * P)) return tile + 1;
    return c + S < n_chunks ? (c + S) * P : -1;
  };

  // Asynchronous copy of one tile's K and V rows into buffer `buf`; masked keys are zero-filled
  // (never read from memory) and get slot -1.
  const uint8_t* kbase = static_cast<const uint8_t*>(p.k_cache);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.v_cache);
  auto issue = [&](int tile, int buf) {
    uint8_t* ks = bufs + buf * Lay.buf_bytes;
    uint8_t* vs = ks + Lay.tile_bytes;
    int32_t* ss = reinterpret_cast<int32_t*>(vs + Lay.tile_bytes);
    for (int i = tid; i < kAttnTile * kCpr; i += kThreads) {
      const int key = i / kCpr, part = i % kCpr;
      const int k = tile * kAttnTile + key;
      int32_t slot = -1;
      if (k < NK) {
        const int bi = k / bs, off = k % bs;
        const int lb = sel ? sel[bi] : bi;
        if (lb >= 0 && int64_t(lb) * bs + off <= pos) slot = table[lb] * bs + off;
      }
      if (part == 0) ss[key] = slot;
      const int64_t src = slot >= 0 ? (int64_t(slot) * KV + g) * D * C::kBytes + part * 16 : 0;
      cp_async_16(ks + key * Lay.row_bytes + part * 16, kbase + src, slot >= 0 ? 16 : 0);
      cp_async_16(vs + key * Lay.row_bytes + part * 16, vbase + src, slot >= 0 ? 16 : 0);
    }
    cp_async_commit();
  };
  const int first_tile = next_tile(-1);
  if (first_tile >= 0) issue(first_tile, 0);

  // q as A fragments (see above): entry (step, lane) holds rows fr and fr + 8, dims
  // 32 (step / 2) + 8 fc + 4 (step % 2) + {0..3}, in its three parts.
  if (first_tile >= 0) {
    const float* qg = p.q + (int64_t(t) * p.num_heads + int64_t(g) * G) * D;
    for (int i = tid; i < kSteps * 32; i += kThreads) {
      const int st = i >> 5, l = i & 31, r = l >> 2;
      const int d = (st >> 1) * 32 + (l & 3) * 8 + (st & 1) * 4;
      const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 a = r < G ? *reinterpret_cast<const float4*>(qg + r * D + d) : z;
      const float4 b = r + 8 < G ? *reinterpret_cast<const float4*>(qg + (r + 8) * D + d) : z;
      uint4 hi, mid, lo;
      mma::split_hi_mid_lo(a.x, a.y, hi.x, mid.x, lo.x);
      mma::split_hi_mid_lo(b.x, b.y, hi.y, mid.y, lo.y);
      mma::split_hi_mid_lo(a.z, a.w, hi.z, mid.z, lo.z);
      mma::split_hi_mid_lo(b.z, b.w, hi.w, mid.w, lo.w);
      qfrag[(0 * kSteps + st) * 32 + l] = hi;
      qfrag[(1 * kSteps + st) * 32 + l] = mid;
      qfrag[(2 * kSteps + st) * 32 + l] = lo;
    }
  }

  const float qk_scale = p.k_scale * p.softmax_scale;
  // Softmax state of heads warp and warp + 8 (chunk: m, l; S == 1 running fold: Mr, Lr), and the
  // output fragments of channel tiles warp + 8 i: acc (chunk) and Ar (running fold), elements
  // {0, 1}: head fr, channels 8 nt + 2 fc + {0, 1}; {2, 3}: head fr + 8.
  float m[2], l[2], Mr[2], Lr[2];
  float acc[kNT][4], Ar[kNT][4];
  auto reset_chunk = [&] {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      m[j] = -INFINITY;
      l[j] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  };
  reset_chunk();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    Mr[j] = -INFINITY;
    Lr[j] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < kNT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) Ar[i][e] = 0.f;
  // End of chunk c: fold it (S == 1) or write its state (S > 1), then start afresh.
  auto finish_chunk = [&](int c) {
    if (S == 1) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = warp + 8 * j;
        const FoldWeights f = attention_fold_weights(Mr[j], m[j]);
        Lr[j] = attention_fold(Lr[j], l[j], f);
        Mr[j] = f.M;
        if (lane == 0) {
          heads[16 + h] = f.a;
          heads[32 + h] = f.b;
        }
      }
      grp.sync();
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = fr + 8 * (e >> 1);
        const FoldWeights f{0.f, heads[16 + h], heads[32 + h]};
#pragma unroll
        for (int i = 0; i < kNT; ++i) Ar[i][e] = attention_fold(Ar[i][e], acc[i][e], f);
      }
    } else {
      const int64_t row0 = (int64_t(t) * KV + g) * p.max_chunks + c;  // row of head h: row0 * G + h
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = warp + 8 * j;
        if (lane == 0 && h < G) {
          p.part_ml[(row0 * G + h) * 2] = m[j];
          p.part_ml[(row0 * G + h) * 2 + 1] = l[j];
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int h = fr + 8 * hh;
        if (h >= G) continue;
        float* o = p.part_o + (row0 * G + h) * D + 2 * fc;
#pragma unroll
        for (int i = 0; i < kNT; ++i)
          *reinterpret_cast<float2*>(o + 8 * (warp + 8 * i)) = make_float2(acc[i][2 * hh], acc[i][2 * hh + 1]);
      }
    }
    reset_chunk();
  };
  grp.sync();  // qfrag

  int buf = 0;
  for (int tile = first_tile; tile >= 0;) {
    const int next = next_tile(tile);
    // Double buffering: the next tile's copy is in flight while this one is computed.
    if (next >= 0) {
      issue(next, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    grp.sync();
    const uint8_t* ks = bufs + buf * Lay.buf_bytes;
    const uint8_t* vs = ks + Lay.tile_bytes;
    const int32_t slot = reinterpret_cast<const int32_t*>(vs + Lay.tile_bytes)[lane];

    if (warp < 4) {
      // q.k of keys 8 warp .. + 7.
      const uint8_t* kr = ks + (warp * 8 + fr) * Lay.row_bytes;
      float sc[4];
#pragma unroll
      for (int b = 0; b < D / 32; ++b) {
        uint32_t kb[4];  // step 0: b0, b1; step 1: b0, b1
        if constexpr (C::kBytes == 1) {
          const uint2 v = *reinterpret_cast<const uint2*>(kr + b * 32 + fc * 8);
          mma::e4m3x4_to_bf16x2(v.x, kb[0], kb[1]);
          mma::e4m3x4_to_bf16x2(v.y, kb[2], kb[3]);
        } else {
          const uint4 v = *reinterpret_cast<const uint4*>(kr + (b * 32 + fc * 8) * 2);
          kb[0] = v.x;
          kb[1] = v.y;
          kb[2] = v.z;
          kb[3] = v.w;
        }
        float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            const uint4 q = qfrag[(part * kSteps + 2 * b + st) * 32 + lane];
            const uint32_t a[4] = {q.x, q.y, q.z, q.w};
            mma::mma_bf16(blk, a, kb[2 * st], kb[2 * st + 1]);
          }
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[e] = b == 0 ? blk[e] : __fadd_rn(sc[e], blk[e]);
      }
      float* srow = scores + fr * kLd + warp * 8 + 2 * fc;
      *reinterpret_cast<float2*>(srow) = make_float2(sc[0], sc[1]);
      *reinterpret_cast<float2*>(srow + 8 * kLd) = make_float2(sc[2], sc[3]);
    } else if constexpr (C::kBytes == 1) {
      // The V tile to bf16, 16 elements a thread and step.
      for (int i = tid - 128; i < kAttnTile * kCpr; i += kThreads - 128) {
        const int row = i / kCpr, part = i % kCpr;
        const uint4 v = *reinterpret_cast<const uint4*>(vs + row * Lay.row_bytes + part * 16);
        uint4 o0, o1;
        mma::e4m3x4_to_bf16x2(v.x, o0.x, o0.y);
        mma::e4m3x4_to_bf16x2(v.y, o0.z, o0.w);
        mma::e4m3x4_to_bf16x2(v.z, o1.x, o1.y);
        mma::e4m3x4_to_bf16x2(v.w, o1.z, o1.w);
        uint4* dst = reinterpret_cast<uint4*>(vdec + row * Lay.vdec_row + part * 32);
        dst[0] = o0;
        dst[1] = o1;
      }
    }
    grp.sync();  // scores, vdec

    // Online softmax of heads warp and warp + 8 over the tile (lane = key), then the
    // probabilities as A fragments: lanes 2c and 2c + 1 form one bf16x2 word of each part.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = warp + 8 * j;
      float pr = 0.f, alpha = 1.f;
      if (h < G) {
        // explicit roundings: the native and mono kernels are compiled apart and must agree
        const float sc = slot >= 0 ? __fmul_rn(scores[h * kLd + lane], qk_scale) : -INFINITY;
        const float mn = fmaxf(m[j], warp_max(sc));
        if (mn != -INFINITY) {  // else no visible key so far: p = 0, nothing to rescale
          alpha = expf(__fsub_rn(m[j], mn));  // m = -inf -> 0
          pr = expf(__fsub_rn(sc, mn));       // masked key -> 0
          l[j] = __fmaf_rn(l[j], alpha, warp_sum(pr));
          m[j] = mn;
        }
      }
      if (lane == 0) heads[h] = alpha;
      const float pn = __shfl_down_sync(kFullMask, pr, 1);
      if ((lane & 1) == 0) {
        uint32_t hi, mid, lo;
        mma::split_hi_mid_lo(pr, pn, hi, mid, lo);
        const int st = lane >> 4, c = lane & 15;
        // A fragment: a0 row fr keys 2 fc, +1; a1 row fr + 8; a2 / a3 keys 2 fc + 8, +9.
        uint32_t* f = reinterpret_cast<uint32_t*>(pfrag + st * 32 + warp * 4 + ((c & 7) >> 1)) + (c >> 3) * 2 + j;
        f[0] = hi;
        f[2 * 32 * 4] = mid;
        f[4 * 32 * 4] = lo;
      }
    }
    grp.sync();  // pfrag, heads

    // p.V: channel tiles warp + 8 i.
    {
      uint4 pa[3][2];
#pragma unroll
      for (int part = 0; part < 3; ++part)
#pragma unroll
        for (int st = 0; st < 2; ++st) pa[part][st] = pfrag[(part * 2 + st) * 32 + lane];
      const float al0 = heads[fr], al1 = heads[fr + 8];
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
        const int nt = warp + 8 * i;
        uint32_t vb[4];
        if constexpr (C::kBytes == 1) mma::ldmatrix_x4_trans(vb, vdec + lane * Lay.vdec_row + nt * 16);
        else mma::ldmatrix_x4_trans(vb, vs + lane * Lay.row_bytes + nt * 16);
        float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            const uint32_t a[4] = {pa[part][st].x, pa[part][st].y, pa[part][st].z, pa[part][st].w};
            mma::mma_bf16(blk, a, vb[2 * st], vb[2 * st + 1]);
          }
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = __fmaf_rn(acc[i][e], e < 2 ? al0 : al1, blk[e]);
      }
    }
    grp.sync();  // this buffer is refilled two tiles later; scores, pfrag and heads are rewritten
    if (next < 0 || next / P != tile / P) finish_chunk(tile / P);
    tile = next;
    buf ^= 1;
  }

  // Results of the S == 1 mode (padding rows and empty lists: L = 0 -> zeros).
  if (S == 1) {
    grp.sync();  // the last fold's weights are read
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (lane == 0) heads[16 + warp + 8 * j] = attention_out_scale(Lr[j], p.v_scale);
    grp.sync();
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = fr + 8 * hh;
      if (h >= G) continue;
      const float inv = heads[16 + h];
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = (g * G + h) * D + 8 * (warp + 8 * i) + 2 * fc + e;  // of row t (H * D values)
          const float v = __fmul_rn(Ar[i][2 * hh + e], inv);
          p.out[int64_t(t) * p.num_heads * D + col] = v;
          if (p.out_split) store_split_element(p.out_split + 2 * int64_t(t) * p.num_heads * D, col, v);
        }
      }
    }
  }
}


// One group per (token, KV group, slice of nthreads outputs): w = (t * KV + g) * slices + c,
// `nthreads` threads (a multiple of 32), smem: attention_combine_smem_floats(G, C) floats. Folds
// the n chunk states of (t, g) in chunk order exactly as the S == 1 mode does: one warp per head
// computes the prefix maxima and the weights (a_c, b_c) of every chunk (in parallel; a max is
// exact in any order) and the sequential L chain, then each thread folds its output channel over
// the chunks: the chunk count, the first 32 chunks' states and values all loaded at once (one
// round trip before any compute), later ones 16 at a time before their use.
// kEarly (launches of up to kCombineEarlyRows rows): the values too are loaded before n is known.
constexpr int kCombineEarlyRows = 4;
template <bool kEarly>
__device__ __forceinline__ void attention_combine_rows(const AttentionParams& p, int64_t w, Group grp, float* smem) {
  const int tid = grp.tid, nthreads = grp.nthreads;
  const int H = p.num_heads, KV = p.kv_heads, G = H / KV, D = p.head_dim, C = p.max_chunks;
  const int slices = attention_combine_chunks(G, D, nthreads);
  const ItemSplit wc = item_split(w, slices), wg = item_split(wc.q, KV);
  const int c = wc.r, t = int(wg.q), g = wg.r;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int64_t base = (int64_t(t) * KV + g) * C;  // state of chunk k, head h: (base + k) * G + h
  float* o = p.out + (int64_t(t) * H + int64_t(g) * G) * D;
  const int i = c * nthreads + tid;  // this thread's output channel (h, d) = (i / D, i % D)
  // Latency is what this costs at decode. The chunk count n, the first 32 chunks' states of this
  // warp's first kPreH heads and (kEarly) this thread's output values of the first kPre chunks are
  // all loaded at once, before n is known: the workspace holds C chunks of every (t, g), so the
  // loads up to C are in bounds, and the values of chunks n..C-1 (stale) are never used. Larger
  // launches load the values after n (padding rows and short lists would otherwise read up to
  // C G D floats each for nothing: 256 KB at C = 32, G = 16, D = 128). One load site per copy:
  // both in one function kept pre[] in local memory (ptxas: 256 B of spill stores).
  const int pos = p.positions[t];
  const int pn = p.part_n[int64_t(t) * KV + g];  // written for every row by split item 0
  float* wa = smem;                  // [G][C]
  float* wb = smem + G * C;          // [G][C]
  float* inv = smem + 2 * G * C;     // [G]
  constexpr int kPre = 32, kPreH = 2;
  const bool mine = i < G * D;
  const int ho = mine ? i / D : 0, d_o = mine ? i % D : 0;
  const float* po = p.part_o + (base * G + ho) * D + d_o;  // chunk k at + k * G * D
  float pre[kPre];
  if constexpr (kEarly) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) pre[j] = mine && j < C ? po[int64_t(j) * G * D] : 0.f;
  }
  float pre_m[kPreH], pre_l[kPreH];
#pragma unroll
  for (int q = 0; q < kPreH; ++q) {
    const int h = warp + q * nwarps;
    const bool ok = h < G && lane < C;
    const int64_t r = (base + lane) * G + h;
    pre_m[q] = ok ? p.part_ml[r * 2] : 0.f;
    pre_l[q] = ok ? p.part_ml[r * 2 + 1] : 0.f;
  }
  const int n = pos < 0 ? 0 : pn;
  if constexpr (!kEarly) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) pre[j] = mine && j < n ? po[int64_t(j) * G * D] : 0.f;
  }
  for (int h = warp, q = 0; h < G; h += nwarps, ++q) {
    float Mprev = -INFINITY, L = 0.f;  // lane 0's running values
    for (int k0 = 0; k0 < n; k0 += 32) {
      const int k = k0 + lane;
      const int64_t r = (base + k) * G + h;
      float mk = -INFINITY, lk = 0.f;
      if (k < n) {
        if (k0 == 0 && q < kPreH) {
#pragma unroll
          for (int u = 0; u < kPreH; ++u)  // (selects, not a runtime-indexed local array)
            if (q == u) {
              mk = pre_m[u];
              lk = pre_l[u];
            }
        } else {
          mk = p.part_ml[r * 2];
          lk = p.part_ml[r * 2 + 1];
        }
      }
      // inclusive prefix max over the lanes, continuing from the previous 32 chunks
      float M = mk;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const float o2 = __shfl_up_sync(0xffffffffu, M, d);
        if (lane >= d) M = fmaxf(M, o2);
      }
      const float Mcarry = __shfl_sync(0xffffffffu, Mprev, 0);
      M = fmaxf(M, Mcarry);
      float Mbefore = __shfl_up_sync(0xffffffffu, M, 1);
      if (lane == 0) Mbefore = Mcarry;
      const FoldWeights f = attention_fold_weights(Mbefore, mk);
      if (k < n) {
        wa[h * C + k] = f.a;
        wb[h * C + k] = f.b;
      }
      // the L chain, in chunk order (lane 0's value is used): the 32 chunks' shuffles do not
      // depend on the chain, so they are unrolled and issued ahead of its multiply-adds
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float aj = __shfl_sync(0xffffffffu, f.a, j), bj = __shfl_sync(0xffffffffu, f.b, j);
        const float lj = __shfl_sync(0xffffffffu, lk, j);
        if (k0 + j < n) L = attention_fold(L, lj, FoldWeights{0.f, aj, bj});
      }
      Mprev = __shfl_sync(0xffffffffu, M, 31);
    }
    if (lane == 0) inv[h] = attention_out_scale(L, p.v_scale);
  }
  grp.sync();
  if (!mine) return;
  const int h = ho;
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < kPre; ++j)
    if (j < n) a = attention_fold(a, pre[j], FoldWeights{0.f, wa[h * C + j], wb[h * C + j]});
  for (int k0 = kPre; k0 < n; k0 += 16) {
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = k0 + j < n ? po[int64_t(k0 + j) * G * D] : 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      if (k0 + j < n) a = attention_fold(a, v[j], FoldWeights{0.f, wa[h * C + k0 + j], wb[h * C + k0 + j]});
  }
  const float v = __fmul_rn(a, inv[h]);
  o[i] = v;
  if (p.out_split) store_split_element(p.out_split + 2 * int64_t(t) * H * D, g * G * D + i, v);
}

__device__ inline void attention_combine_work(const AttentionParams& p, int64_t w, Group grp, float* smem) {
  if (p.num_tokens <= kCombineEarlyRows) attention_combine_rows<true>(p, w, grp, smem);
  else attention_combine_rows<false>(p, w, grp, smem);
}

// ---- the ops (attention_params.h shapes) ----
template <class C, int D>
struct AttentionSplitOp : OpBounds<kAttnThreads> {
  using Params = AttentionParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) { attention_split_work<C, D>(p, w, g, smem); }
};
struct AttentionCombineOp : OpBounds<kAttnCombineThreads> {
  using Params = AttentionParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    attention_combine_work(p, w, g, reinterpret_cast<float*>(smem));
  }
};

}  // namespace m3::kernels
