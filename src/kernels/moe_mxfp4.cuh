// MXFP4 expert projections grouped by expert (gate/up + SwiGLU-OAI, or down) on CUDA cores, and the
// fixed-order combine of the routed and shared experts' outputs. The default expert kernels are the
// tensor-core ones of kernels/moe_mma.cuh; this GEMV stays as the fallback (native::MoeKernel::Gemv,
// M3_MOE_GEMV=1) and as the benchmark's yardstick.
//
// Expert weights: codes [slots][N rows][ld bytes] (E2M1 pairs, element 2i in the low nibble of
// byte i, rows padded to whole 32-element blocks with zero codes), scales [slots][N][sld] (E8M0,
// one per 32 inputs). W13 rows are interleaved: row 2j = gate j, row 2j+1 = up j.
// Routing comes as a list of active entries (router.cuh, moe_group_work): entry a is expert slot
// entry_slot[a] with pairs [entry_begin[a], entry_begin[a+1]); pair p reads activation row
// pair_row[p] (or p when pair_row is null) and writes output row p.
//   gate/up: h[p, j]  = swiglu_oai(sum_k W13[2j, k] x[row(p), k], sum_k W13[2j+1, k] x[row(p), k])
//   down   : y[p, n]  = sum_k W2[n, k] h[p, k]
// Value of a code: e2m1 * 2^(scale - 127). Per 32-element block the products are summed in fp32,
// then scaled by the block's E8M0 (exact: a power of two) into the row accumulator.
// Work item w = (entry w / groups, rows [2 (w % groups), + 2)) for ONE WARP: lane i reads the
// 16-byte chunks i, i + 32, ... of both rows (a gate/up pair, so the warp produces whole SwiGLU
// outputs), kMoeInflight chunks per row in flight; a fixed-order warp reduction, no shared memory,
// no block barrier, no atomics. Entries past *num_entries exit at once, so the grid can be sized
// for the most entries a batch can have.
//   combine: out[t, :] = y[shared_base + t, :] (when there is a shared expert)
//                        + sum_k w[t, k] * y[pos_of[t*K + k], :]    in k order (best choice first).
#pragma once
#include <cstdint>

#include "kernels/fused_norm.cuh"
#include "kernels/moe_params.h"
#include "kernels/swiglu.cuh"
#include "kernels/weight_stream.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

namespace moe_detail {

// Rows n0, n0 + 1 of one slot for pairs [p0, p0 + n) (n <= MT), one warp.
template <ActFmt X, int MT>
__device__ __forceinline__ void rows_pass(const MoeGemvParams& p, const uint8_t* codes, const uint8_t* scales,
                                          int n0, int p0, int n, int lane) {
  constexpr int U = kMoeInflight;
  const int nchunks = (p.K + 31) / 32;
  const uint8_t* crow[2];
  const uint8_t* srow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = min(n0 + r, p.N - 1);
    crow[r] = codes + row * p.ld;
    srow[r] = scales + row * p.sld;
  }
  int xrow[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int pp = p0 + min(t, n - 1);
    xrow[t] = p.pair_row ? p.pair_row[pp] : pp;
  }
  float acc[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = 0.f;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * U) {
    uint4 wv[U][2];
    uint8_t sv[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * 32;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        wv[u][r] = c < nchunks ? wstream::ld_stream(crow[r] + int64_t(c) * 16) : uint4{};
        sv[u][r] = c < nchunks ? __ldg(srow[r] + c) : uint8_t(127);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * 32;
      if (c >= nchunks) break;
      if constexpr (MT == 1) {
        // one token: activations loaded once, one decoded row live at a time
        float xf[32];
        wstream::load_act<X, 32>(p.x, p.ld_x, xrow[0], c * 32, p.K, xf);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float wf[32];
          wstream::decode_e2m1x32_scaled(wv[u][r], wf);
          float part = 0.f;
#pragma unroll
          for (int e = 0; e < 32; ++e) part = fmaf(wf[e], xf[e], part);
          acc[0][r] = fmaf(part, e8m0_to_f32(sv[u][r]), acc[0][r]);
        }
      } else {
        // both rows decoded once, each token's activations loaded once
        float w0[32], w1[32];
        wstream::decode_e2m1x32_scaled(wv[u][0], w0);
        wstream::decode_e2m1x32_scaled(wv[u][1], w1);
        const float s0 = e8m0_to_f32(sv[u][0]), s1 = e8m0_to_f32(sv[u][1]);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          float xf[32];
          wstream::load_act<X, 32>(p.x, p.ld_x, xrow[t], c * 32, p.K, xf);
          float a0 = 0.f, a1 = 0.f;
#pragma unroll
          for (int e = 0; e < 32; ++e) {
            a0 = fmaf(w0[e], xf[e], a0);
            a1 = fmaf(w1[e], xf[e], a1);
          }
          acc[t][0] = fmaf(a0, s0, acc[t][0]);
          acc[t][1] = fmaf(a1, s1, acc[t][1]);
        }
      }
    }
  }
  // fixed-order butterfly; decoded codes were 2^-14 of their values
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    acc[t][0] = wstream::warp_sum_xor(acc[t][0]) * 16384.0f;
    acc[t][1] = wstream::warp_sum_xor(acc[t][1]) * 16384.0f;
  }
  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    if (t >= n) break;
    if (p.nin.inv) {
      acc[t][0] = norm_apply(p.nin, nullptr, xrow[t], acc[t][0]);
      acc[t][1] = norm_apply(p.nin, nullptr, xrow[t], acc[t][1]);
    }
    float* y = p.y + int64_t(p0 + t) * p.ld_y;
    if (p.swiglu) {
      if (n0 + 1 < p.N) y[n0 / 2] = swiglu_oai_f32(acc[t][0], acc[t][1], p.alpha, p.limit);
    } else {
      y[n0] = acc[t][0];
      if (n0 + 1 < p.N) y[n0 + 1] = acc[t][1];
    }
  }
}

}  // namespace moe_detail

// One warp work item (lane 0..31). Pairs of the entry are taken in passes of up to MT tokens; a
// pass of a single token takes the one-token body, others the MT body with absent tokens masked.
template <ActFmt X, int MT>
__device__ __forceinline__ void moe_gemv_work(const MoeGemvParams& p, int work, int lane) {
  static_assert(MT <= kMoeMaxTokens, "tokens per pass");
  const int a = work / p.groups, g = work % p.groups;
  if (a >= *p.num_entries) return;
  const int slot = p.entry_slot[a];
  const int begin = p.entry_begin[a], end = p.entry_begin[a + 1];
  const uint8_t* codes = p.codes + int64_t(slot) * p.slot_codes;
  const uint8_t* scales = p.scales + int64_t(slot) * p.slot_scales;
  const int n0 = g * kMoeRowsPerWarp;
  for (int p0 = begin; p0 < end; p0 += MT) {
    const int n = min(MT, end - p0);
    if (MT == 1 || n == 1) moe_detail::rows_pass<X, 1>(p, codes, scales, n0, p0, n, lane);
    else moe_detail::rows_pass<X, MT>(p, codes, scales, n0, p0, n, lane);
  }
}


// Work item = (token t, slice c of the group's nthreads hidden channels): thread i sums channel
// c * nthreads + i over the shared expert and the K choices in k order. One channel per thread, so
// no thread walks the row (a loop over the row would serialize its loads behind the stores).
// With the fused norm (p.nout; H % 16 == 0) the sum goes into the residual stream instead of out:
// a chunk's 16 channels are a half warp of the group.
// One channel h of token t (every lane of the half-warp calls it in the same step when p.nout is
// set: lane % 16 == h % 16).
__device__ __forceinline__ void moe_combine_element(const MoeCombineParams& p, int t, int h, int lane) {
  const bool live = h < p.H;
  if (!live && !p.nout.res) return;
  float acc = 0.f;
  if (live) {
    if (p.shared_base >= 0) acc = p.y[int64_t(p.shared_base + t) * p.ld_y + h];
    for (int k = 0; k < p.K; ++k) {
      const int i = t * p.K + k;
      acc = fmaf(p.topk_w[i], p.y[int64_t(p.pos_of[i]) * p.ld_y + h], acc);
    }
  }
  if (p.nout.res) norm_out_element(p.nout, live, t, h, acc, lane);
  else p.out[int64_t(t) * p.ld_out + h] = acc;
}
__device__ __forceinline__ void moe_combine_work(const MoeCombineParams& p, int t, int c, Group g) {
  moe_combine_element(p, t, c * g.nthreads + g.tid, g.lane());
}

// ---- the ops (moe_params.h shapes) ----
template <int MT>
struct MoeGemvOp : OpBounds<32 * kMoeGemvWarps> {
  using Params = MoeGemvParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int64_t work = w * kMoeGemvWarps + g.warp();
    if (work < p.warp_items) moe_gemv_work<ActFmt::F32, MT>(p, int(work), g.lane());
  }
};

struct MoeCombineOp : OpBounds<kMoeCombineThreads> {
  using Params = MoeCombineParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int64_t slices = ceil_div(p.H, kMoeCombineThreads);
    moe_combine_work(p, int(w / slices), int(w % slices), g);
  }
};

}  // namespace m3::kernels
