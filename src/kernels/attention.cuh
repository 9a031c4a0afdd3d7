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
// are masked. Dense: keys 0..p. The list is cut into 32-key tiles and tiles into `num_splits`
// contiguous ranges; work item w = (t * KV + g) * S + s handles range s of (t, g) with a thread
// block of 4 warps: warp w owns heads w, w+4, w+8, w+12 of the group (G <= 16), keeps their online
// softmax state (max m, sum l) and output accumulators. Per tile: lane = key for q.k (whole K row
// per lane, q from shared memory), warp reductions for the tile max / sum, then lane = channel
// slice for p.V (probabilities broadcast by shuffle).
// S == 1: out[t, h, :] = v_scale * acc / l directly. S > 1: partial (acc, m, l) per split go to a
// workspace and attention_combine_work merges them:
//   M = max_s m_s, L = sum_s e^{m_s - M} l_s, out = v_scale * sum_s e^{m_s - M} acc_s / L.
// Padding rows (position -1) produce zeros.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention_common.cuh"

namespace m3::kernels {

constexpr int kAttnWarps = 4;
constexpr int kAttnHeadsPerWarp = 4;
constexpr int kAttnMaxGroup = kAttnWarps * kAttnHeadsPerWarp;  // 16 query heads per KV head
constexpr int kAttnTile = 32;                                  // keys per tile (one per lane)

struct AttentionParams {
  const float* q = nullptr;        // [T, H*D] (normed, rotated)
  const void* k_cache = nullptr;   // [slots, KV, D]
  const void* v_cache = nullptr;   // [slots, KV, D]
  float k_scale = 1, v_scale = 1;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* block_tables = nullptr;  // [num_seqs, table_width]
  int table_width = 0;
  const int32_t* selected = nullptr;  // [T, KV, topk] logical block ids ascending, -1 padded; null = dense
  int topk = 0;
  int num_tokens = 0, num_heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  float softmax_scale = 1;
  int num_splits = 1;
  float* out = nullptr;      // [T, H*D]
  float* part_o = nullptr;   // [T, KV, S, G, D]   (S > 1)
  float* part_ml = nullptr;  // [T, KV, S, G, 2]   (S > 1)
};

// Thread block of kAttnWarps * 32 threads; q_s: G * D floats of shared memory.
template <class C, int D>
__device__ void attention_split_work(int64_t w, int tid, float* q_s, const AttentionParams& p) {
  static_assert(D % 32 == 0 && D <= 128, "attention: head_dim must be 32, 64, 96 or 128");
  using Store = typename C::Store;
  constexpr int kChunk = 16 / C::kBytes;                              // elements per 16-byte K load
  constexpr int kEpl = (D / 32) > (4 / C::kBytes) ? D / 32 : 4 / C::kBytes;  // V channels per lane
  static_assert(D % kChunk == 0 && D % kEpl == 0, "attention: head_dim vs load width");
  const int S = p.num_splits, KV = p.kv_heads, G = p.num_heads / p.kv_heads, bs = p.block_size;
  const int s = int(w % S), g = int((w / S) % KV), t = int(w / (int64_t(S) * KV));
  const int lane = tid & 31, warp = tid >> 5;
  const int pos = p.positions[t];

  const int32_t* sel = nullptr;
  const int32_t* table = nullptr;
  int NK = 0;
  if (pos >= 0) {
    table = p.block_tables + int64_t(p.token_seq[t]) * p.table_width;
    if (p.selected) {
      sel = p.selected + (int64_t(t) * KV + g) * p.topk;
      int n = 0;
      while (n < p.topk && sel[n] >= 0) ++n;
      NK = n * bs;
    } else {
      NK = pos + 1;
    }
    const float* qg = p.q + (int64_t(t) * p.num_heads + int64_t(g) * G) * D;
    for (int i = tid; i < G * D; i += kAttnWarps * 32) q_s[i] = qg[i];
  }
  __syncthreads();

  const int n_tiles = (NK + kAttnTile - 1) / kAttnTile;
  const int tps = (n_tiles + S - 1) / S;
  const int tile_begin = s * tps, tile_end = min(n_tiles, tile_begin + tps);
  const float qk_scale = p.k_scale * p.softmax_scale;
  const bool pv_lane = lane * kEpl < D;

  float m[kAttnHeadsPerWarp], l[kAttnHeadsPerWarp], acc[kAttnHeadsPerWarp][kEpl];
#pragma unroll
  for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[j][e] = 0.f;
  }

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    // This lane's key: its slot, or -1 when masked.
    const int k = tile * kAttnTile + lane;
    int32_t slot = -1;
    if (k < NK) {
      const int bi = k / bs, off = k % bs;
      const int lb = sel ? sel[bi] : bi;
      if (lb >= 0 && int64_t(lb) * bs + off <= pos) slot = table[lb] * bs + off;
    }
    float sc[kAttnHeadsPerWarp];
#pragma unroll
    for (int j = 0; j < kAttnHeadsPerWarp; ++j) sc[j] = 0.f;
    if (slot >= 0) {
      const Store* kr = static_cast<const Store*>(p.k_cache) + (int64_t(slot) * KV + g) * D;
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

    // p.V: lane owns channels [lane * kEpl, lane * kEpl + kEpl).
#pragma unroll 4
    for (int c = 0; c < kAttnTile; ++c) {
      const int32_t sl = __shfl_sync(kFullMask, slot, c);
      if (sl < 0) continue;  // uniform
      float vv[kEpl];
      if (pv_lane) {
        const Store* vr = static_cast<const Store*>(p.v_cache) + (int64_t(sl) * KV + g) * D + lane * kEpl;
        load_decode<C, kEpl>(vr, vv);
      }
#pragma unroll
      for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
        const float pc = __shfl_sync(kFullMask, pr[j], c);
        if (pv_lane) {
#pragma unroll
          for (int e = 0; e < kEpl; ++e) acc[j][e] = fmaf(pc, vv[e], acc[j][e]);
        }
      }
    }
  }

  // Results.
#pragma unroll
  for (int j = 0; j < kAttnHeadsPerWarp; ++j) {
    const int h = warp + kAttnWarps * j;
    if (h >= G) continue;
    if (S == 1) {
      const float inv = l[j] > 0.f ? p.v_scale / l[j] : 0.f;
      float* o = p.out + (int64_t(t) * p.num_heads + int64_t(g) * G + h) * D + lane * kEpl;
      if (pv_lane) {
#pragma unroll
        for (int e = 0; e < kEpl; ++e) o[e] = acc[j][e] * inv;
      }
    } else {
      const int64_t row = ((int64_t(t) * KV + g) * S + s) * G + h;
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
}

// One warp per (token, query head): w = t * H + h. Merges the S partial results.
__device__ inline void attention_combine_work(int64_t w, int lane, const AttentionParams& p) {
  const int H = p.num_heads, KV = p.kv_heads, G = H / KV, D = p.head_dim, S = p.num_splits;
  const int t = int(w / H), h = int(w % H), g = h / G, hi = h % G;
  float* o = p.out + (int64_t(t) * H + h) * D;
  const int64_t row0 = (int64_t(t) * KV + g) * S * G + hi;  // split s: row0 + s * G
  float M = -INFINITY;
  if (p.positions[t] >= 0)
    for (int s = 0; s < S; ++s) M = fmaxf(M, p.part_ml[(row0 + int64_t(s) * G) * 2]);
  if (M == -INFINITY) {  // padding row (or nothing visible)
    for (int d = lane; d < D; d += 32) o[d] = 0.f;
    return;
  }
  float L = 0.f;
  for (int s = 0; s < S; ++s) {
    const int64_t r = row0 + int64_t(s) * G;
    L += expf(p.part_ml[r * 2] - M) * p.part_ml[r * 2 + 1];
  }
  const float inv = p.v_scale / L;
  for (int d = lane; d < D; d += 32) {
    float a = 0.f;
    for (int s = 0; s < S; ++s) {
      const int64_t r = row0 + int64_t(s) * G;
      const float ms = p.part_ml[r * 2];
      if (ms == -INFINITY) continue;
      a = fmaf(expf(ms - M), p.part_o[r * D + d], a);
    }
    o[d] = a * inv;
  }
}

}  // namespace m3::kernels
