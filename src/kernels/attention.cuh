// Paged attention over FP8/BF16 K/V caches, block-sparse (MSA) or dense causal, any number of
// tokens, split-K (flash-decoding) so small batches still fill the GPU.
//
// Math, for token t at position p and query head h of KV group g = h / G (G = H / KV):
//   keys J = { j <= p : j in a selected logical block of (t, g) }   (dense: all j <= p)
//   s_j = (q_h . K[j]) * k_scale / sqrt(D)      o_h = v_scale * sum_j softmax(s)_j V[j]
// with K/V decoded from the cache (stored value x scale), fp32 everywhere.
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
// Work item w = (t * KV + g) * S + s, a thread block of 8 warps: warp w owns heads w and w+8 of
// the group (G <= 16), keeps their online softmax state (max m, sum l) and output accumulators.
// Tiles of K and V rows are copied into shared memory with cp.async, double-buffered (the next
// tile of the block's list loads while this one computes); per tile: lane = key for q.k (q and K
// from shared memory), warp reductions for the tile max / sum, then lane = channel slice for p.V
// (probabilities broadcast by shuffle).
// Padding rows (position -1) produce zeros.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/act_split.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/attention_params.h"
#include "kernels/block_topk.cuh"
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

// Shared memory of one work item: q [G][D] fp32, then two buffers of {K tile, V tile: 32 rows of
// row_bytes, slots: 32 int32}. Rows are padded by 16 bytes so that lane-per-row 16-byte reads
// (lane = key in q.k) hit distinct banks.
template <class C, int D>
struct AttnSmem {
  static constexpr int kRowBytes = D * C::kBytes + 16;
  static constexpr int kTileBytes = kAttnTile * kRowBytes;
  static constexpr int kBufBytes = 2 * kTileBytes + kAttnTile * 4;
  static constexpr int bytes(int group) { return group * D * 4 + 2 * kBufBytes; }
  static_assert(kBufBytes * 2 == attention_split_smem_bytes(0, D, C::kBytes), "attention_params.h's size");
};

// A group of kAttnWarps * 32 threads; smem: AttnSmem<C, D>::bytes(G) bytes (16-byte aligned).
template <class C, int D>
__device__ void attention_split_work(const AttentionParams& p, int64_t w, Group grp, uint8_t* smem) {
  const int tid = grp.tid;
  static_assert(D % 32 == 0 && D <= 128, "attention: head_dim must be 32, 64, 96 or 128");
  using Store = typename C::Store;
  using Sm = AttnSmem<C, D>;
  constexpr int kThreads = kAttnWarps * 32;
  constexpr int kChunk = 16 / C::kBytes;                                      // elements per 16 bytes
  constexpr int kCpr = D * C::kBytes / 16;                                    // 16-byte chunks per row
  constexpr int kEpl = (D / 32) > (4 / C::kBytes) ? D / 32 : 4 / C::kBytes;  // V channels per lane
  static_assert(D % kChunk == 0 && D % kEpl == 0, "attention: head_dim vs load width");
  const int S = p.num_splits, KV = p.kv_heads, G = p.num_heads / p.kv_heads, bs = p.block_size;
  const ItemSplit ws = item_split(w, S), wg = item_split(ws.q, KV);
  const int s = ws.r, g = wg.r, t = int(wg.q);
  const int lane = tid & 31, warp = tid >> 5;
  const int pos = p.positions[t];
  float* q_s = reinterpret_cast<float*>(smem);
  uint8_t* bufs = smem + G * D * 4;

  // The token's position, request and first 32 selected blocks are loaded together (none of the
  // three addresses depends on another's value; a padding row's entries are read and unused).
  // With topk_scores the item selects the blocks itself, into shared memory after the K/V buffers
  // (its scratch in the buffers, before any tile is copied), split 0 writing them to `selected`.
  const int32_t* sel = p.selected ? p.selected + (int64_t(t) * KV + g) * p.topk : nullptr;
  const int32_t seq = p.token_seq[t];
  if (p.topk_scores) {
    int32_t* sel_s = reinterpret_cast<int32_t*>(bufs + 2 * Sm::kBufBytes);
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
    uint8_t* ks = bufs + buf * Sm::kBufBytes;
    uint8_t* vs = ks + Sm::kTileBytes;
    int32_t* ss = reinterpret_cast<int32_t*>(vs + Sm::kTileBytes);
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
      cp_async_16(ks + key * Sm::kRowBytes + part * 16, kbase + src, slot >= 0 ? 16 : 0);
      cp_async_16(vs + key * Sm::kRowBytes + part * 16, vbase + src, slot >= 0 ? 16 : 0);
    }
    cp_async_commit();
  };
  const int first_tile = next_tile(-1);
  if (first_tile >= 0) issue(first_tile, 0);

  if (pos >= 0) {
    const float4* qg = reinterpret_cast<const float4*>(p.q + (int64_t(t) * p.num_heads + int64_t(g) * G) * D);
    float4* qs4 = reinterpret_cast<float4*>(q_s);
#pragma unroll 4
    for (int i = tid; i < G * D / 4; i += kThreads) qs4[i] = qg[i];
  }

  const float qk_scale = p.k_scale * p.softmax_scale;
  const bool pv_lane = lane * kEpl < D;
  // Chunk state (m, l, acc) and, in the S == 1 mode, the running fold (Mr, Lr, Ar).
  float m[kAttnHeadsPerWarp], l[kAttnHeadsPerWarp], acc[kAttnHeadsPerWarp][kEpl];
  float Mr[kAttnHeadsPerWarp], Lr[kAttnHeadsPerWarp], Ar[kAttnHeadsPerWarp][kEpl];
  auto reset_chunk = [&] {
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
      m[j] = -INFINITY;
      l[j] = 0.f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[j][e] = 0.f;
    }
  };
  reset_chunk();
#pragma unroll
  for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
    Mr[j] = -INFINITY;
    Lr[j] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) Ar[j][e] = 0.f;
  }
  // End of chunk c: fold it (S == 1) or write its state (S > 1), then start afresh.
  auto finish_chunk = [&](int c) {
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
      const int h = warp + kAttnWarps * j;
      if (h >= G) continue;
      if (S == 1) {
        const FoldWeights f = attention_fold_weights(Mr[j], m[j]);
        Lr[j] = attention_fold(Lr[j], l[j], f);
#pragma unroll
        for (int e = 0; e < kEpl; ++e) Ar[j][e] = attention_fold(Ar[j][e], acc[j][e], f);
        Mr[j] = f.M;
      } else {
        const int64_t row = ((int64_t(t) * KV + g) * p.max_chunks + c) * G + h;
        float* o = p.part_o + row * D + lane * kEpl;
        if (pv_lane) {
#pragma unroll
          for (int e = 0; e < kEpl; ++e) o[e] = acc[j][e];
        }
        if (lane == 0) {
          p.part_ml[row * 2] = m[j];
          p.part_ml[row * 2 + 1] = l[j];
        }
      }
    }
    reset_chunk();
  };
  grp.sync();  // q_s

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
    const uint8_t* ks = bufs + buf * Sm::kBufBytes;
    const uint8_t* vs = ks + Sm::kTileBytes;
    const int32_t slot = reinterpret_cast<const int32_t*>(vs + Sm::kTileBytes)[lane];

    // q.k: lane = key, its K row from shared memory, q broadcast from shared memory.
    float sc[kAttnHeadsPerWarp];
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) sc[j] = 0.f;
    if (slot >= 0) {
      const Store* kr = reinterpret_cast<const Store*>(ks + lane * Sm::kRowBytes);
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += kChunk) {
        float kv[kChunk];
        load_decode<C, kChunk>(kr + d0, kv);
#pragma unroll
        for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
          const int h = warp + kAttnWarps * j;
          if (h < G) {
            const float4* q4 = reinterpret_cast<const float4*>(q_s + h * D + d0);
#pragma unroll
            for (int e = 0; e < kChunk / 4; ++e) {
              float4 q = q4[e];
              sc[j] = fmaf(q.x, kv[4 * e], sc[j]);
              sc[j] = fmaf(q.y, kv[4 * e + 1], sc[j]);
              sc[j] = fmaf(q.z, kv[4 * e + 2], sc[j]);
              sc[j] = fmaf(q.w, kv[4 * e + 3], sc[j]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kAttnHeadsPerWarp; ++j) sc[j] *= qk_scale;
    } else {
#pragma unroll
      for (int j = 0; j < kAttnHeadsPerWarp; ++j) sc[j] = -INFINITY;
    }

    // Online softmax over the tile (everything below is warp-uniform per head).
    float pr[kAttnHeadsPerWarp];
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
      pr[j] = 0.f;
      if (warp + kAttnWarps * j >= G) continue;
      const float mn = fmaxf(m[j], warp_max(sc[j]));
      if (mn == -INFINITY) continue;  // no visible key so far
      const float alpha = expf(m[j] - mn);  // m = -inf -> 0
      pr[j] = expf(sc[j] - mn);             // masked key -> 0
      l[j] = l[j] * alpha + warp_sum(pr[j]);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[j][e] *= alpha;
      m[j] = mn;
    }

    // p.V: lane owns channels [lane * kEpl, lane * kEpl + kEpl); masked rows are zeros and p = 0.
#pragma unroll 8
    for (int c = 0; c < kAttnTile; ++c) {
      float vv[kEpl];
      if (pv_lane) load_decode<C, kEpl>(reinterpret_cast<const Store*>(vs + c * Sm::kRowBytes) + lane * kEpl, vv);
#pragma unroll
      for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
        const float pc = __shfl_sync(kFullMask, pr[j], c);
        if (pv_lane) {
#pragma unroll
          for (int e = 0; e < kEpl; ++e) acc[j][e] = fmaf(pc, vv[e], acc[j][e]);
        }
      }
    }
    grp.sync();  // this buffer is refilled two tiles later
    if (next < 0 || next / P != tile / P) finish_chunk(tile / P);
    tile = next;
    buf ^= 1;
  }

  // Results of the S == 1 mode (padding rows and empty lists: L = 0 -> zeros).
  if (S == 1) {
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
      const int h = warp + kAttnWarps * j;
      if (h >= G) continue;
      const float inv = attention_out_scale(Lr[j], p.v_scale);
      const int col = (g * G + h) * D + lane * kEpl;  // of row t (H * D values)
      float* o = p.out + int64_t(t) * p.num_heads * D + col;
      if (pv_lane) {
#pragma unroll
        for (int e = 0; e < kEpl; ++e) {
          const float v = __fmul_rn(Ar[j][e], inv);
          o[e] = v;
          if (p.out_split) store_split_element(p.out_split + 2 * int64_t(t) * p.num_heads * D, col + e, v);
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
