// Weight-streaming matrix-vector products for a few tokens (decode): FP8 E4M3 row-scaled, BF16
// and F32 weights, bf16 or fp32 activations, fp32 accumulation and output.
//   plain : y[t, n]   = s_n * sum_k W[n, k] x[t, k]            (s_n: FP8 row scale, else 1)
//   swiglu: y[t, j]   = swiglu_oai(row 2j, row 2j+1)            (rows interleaved gate/up)
// Layouts: W [N rows][ld_w bytes] (ld_w a multiple of 16, codes past K zero), scales [N] fp32,
// x [M][ld_x] (rows 16-byte aligned), y [M][ld_y].
// Work item w = rows [w*R, w*R + R) for all M tokens, handled by one block of kGemvThreads
// threads: thread i reads 16-byte chunks i, i + 128, ... of each of the R rows (U chunks per row
// in flight), multiplies them with the matching activations of up to MT tokens, and the block
// sums the partial products in a fixed order (no atomics: the result is independent of timing).
// A work item covers tokens [t_begin, t_end) in passes of MT (the launcher gives each block one
// pass of its own MT tokens when M > MT, so prefill-sized M spreads over the GPU). A token's
// value depends only on its own activations: thread i's chunks are summed in the order i, i + 128,
// ... whatever MT, U, the pass or the block, and block_sum's order is fixed.
#pragma once
#include <cstdint>

#include "kernels/fused_norm.cuh"
#include "kernels/gemv_params.h"
#include "kernels/swiglu.cuh"
#include "kernels/weight_stream.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

// Rows per work item and chunks in flight per row, by tokens per pass and rows.
template <int MT, int Rows>
struct GemvTile {
  static constexpr int R = Rows;
  static constexpr int U = gemv_chunks_in_flight(MT, Rows);
  static_assert(gemv_rows_ok(MT, Rows, false), "gemv_params.h: R is 1, the default or the prefill R");
};

// One work item over tokens [t_begin, t_end). All kGemvThreads threads of group g call it (it
// synchronizes the group). smem: gemv_smem_floats(MT, R) floats.
template <WeightFmt W, ActFmt X, int MT, int Rows>
__device__ __forceinline__ void gemv_work(const GemvParams& p, int work, Group g, float* smem, int t_begin, int t_end) {
  const int tid = g.tid;
  constexpr int R = GemvTile<MT, Rows>::R, U = GemvTile<MT, Rows>::U;
  constexpr int E = wstream::Chunk<W>::kElems;
  const int n0 = work * R;
  const int nchunks = (p.K + E - 1) / E;
  const uint8_t* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = p.w + int64_t(min(n0 + r, p.N - 1)) * p.ld_w;

  // the norm's inv per token (norm_apply; computed here from the chunk sums, published by
  // block_sum's first barrier)
  float* inv = smem + gemv_inv_offset_floats(MT, R);
  norm_inv_rows(p.nin, g, inv);
  auto normed = [&](float v, int t) { return norm_apply(p.nin, inv, t, v); };
  for (int t0 = t_begin; t0 < t_end; t0 += MT) {
    float acc[MT * R];
#pragma unroll
    for (int i = 0; i < MT * R; ++i) acc[i] = 0.f;
    for (int c0 = tid; c0 < nchunks; c0 += kGemvThreads * U) {
      uint4 wv[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * kGemvThreads;
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = c < nchunks ? wstream::ld_stream(wrow[r] + int64_t(c) * 16) : uint4{};
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * kGemvThreads;
        if (c >= nchunks) break;
        float wf[R][E];
#pragma unroll
        for (int r = 0; r < R; ++r) wstream::decode_chunk<W>(wv[u][r], wf[r]);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          float xf[E];
          wstream::load_act<X, E>(p.x, p.ld_x, min(t0 + t, p.M - 1), c * E, p.K, xf);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[t * R + r] = fmaf(wf[r][e], xf[e], acc[t * R + r]);
        }
      }
    }
    wstream::block_sum<MT * R, kGemvThreads>(acc, g, smem);
    if (!p.swiglu) {
      if (tid < MT * R) {
        const int t = t0 + tid / R, n = n0 + tid % R;
        if (t < t_end && n < p.N) {
          float v = smem[tid];
          if constexpr (W == WeightFmt::FP8) v *= p.w_scale[n];
          p.y[int64_t(t) * p.ld_y + n] = normed(v, t);
        }
      }
    } else if constexpr (R >= 2) {  // SwiGLU: pairs of rows in one item (the launcher's check)
      const int t = t0 + tid / (R / 2), j = tid % (R / 2), n = n0 + 2 * j;
      if (tid < MT * R / 2 && t < t_end && n + 1 < p.N) {
        float g = smem[(tid / (R / 2)) * R + 2 * j], u = smem[(tid / (R / 2)) * R + 2 * j + 1];
        if constexpr (W == WeightFmt::FP8) {
          g *= p.w_scale[n];
          u *= p.w_scale[n + 1];
        }
        g = normed(g, t);
        u = normed(u, t);
        p.y[int64_t(t) * p.ld_y + n / 2] = swiglu_oai_f32(g, u, p.alpha, p.limit);
      }
    }
    g.sync();  // smem is reused by the next pass / work item
  }
}

// The op: item w = (row item, token group) (gemv_shape); a group covers tokens [y * MT, + MT), or
// all M tokens when there is one group (M <= MT). Rows: p.rows (the launcher picks the instance;
// SwiGLU takes the default R, whose pairs of rows stay in one item).
template <WeightFmt W, ActFmt X, int MT, int Rows = gemv_rows_per_item(MT)>
struct GemvOp : OpBounds<kGemvThreads> {
  using Params = GemvParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    const int items = gemv_work_items(p.N, Rows);
    const int x = int(w % items), y = int(w / items);
    const int tb = p.token_groups == 1 ? 0 : y * MT;
    const int te = p.token_groups == 1 ? p.M : min(p.M, tb + MT);
    gemv_work<W, X, MT, Rows>(p, x, g, reinterpret_cast<float*>(smem), tb, te);
  }
};

}  // namespace m3::kernels
