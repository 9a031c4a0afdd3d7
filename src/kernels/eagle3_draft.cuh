// The EAGLE3 draft's own ops (kernels/eagle3_draft_params.h): RoPE with the cache write, causal
// attention over the draft's K/V, the SiLU gate. Small (a few rows a call): written plainly.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/eagle3_draft_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

struct DraftRopeOp : OpBounds<kDraftRopeThreads> {
  using Params = DraftRopeParams;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t* smem_raw) {
    const int i = int(item), pos = p.start + i, half = p.hd / 2, kd = p.kvh * p.hd;
    // the row's angles once (every head rotates by the same ones)
    double* cs = reinterpret_cast<double*>(smem_raw);  // [half][2]: cos, sin
    for (int j = g.tid; j < half; j += g.nthreads) sincos(double(pos) * p.inv_freq[j], &cs[2 * j + 1], &cs[2 * j]);
    g.sync();
    float* row = p.qkv + int64_t(i) * p.ld;
    float* kc = p.k_cache + int64_t(pos) * kd;
    float* vc = p.v_cache + int64_t(pos) * kd;
    const float* k = row + p.nh * p.hd;
    const float* v = k + kd;
    for (int x = g.tid; x < (p.nh + p.kvh) * half; x += g.nthreads) {
      const int h = x / half, j = x % half;
      const double c = cs[2 * j], s = cs[2 * j + 1];
      const bool is_q = h < p.nh;
      const float* src = is_q ? row + h * p.hd : k + (h - p.nh) * p.hd;
      float* dst = is_q ? row + h * p.hd : kc + (h - p.nh) * p.hd;
      const double x1 = src[j], x2 = src[j + half];
      dst[j] = float(x1 * c - x2 * s);
      dst[j + half] = float(x2 * c + x1 * s);
    }
    for (int x = g.tid; x < kd; x += g.nthreads) vc[x] = v[x];
    g.sync();  // smem reuse
  }
};

// kT: head dims a lane holds (hd <= 32 kT)
template <int kT>
struct DraftAttnOp : OpBounds<kDraftAttnThreads> {
  using Params = DraftAttnParams;
  static constexpr int kWarps = kDraftAttnThreads / 32, kH = kDraftAttnHeads;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t* smem_raw) {
    const int G = p.nh / p.kvh, HG = draft_attn_groups(p), hd = p.hd, kd = p.kvh * p.hd;
    int64_t w = item;
    const int sp = int(w % p.splits);
    w /= p.splits;
    const int hg = int(w % HG);
    w /= HG;
    const int kv = int(w % p.kvh), i = int(w / p.kvh);
    const int h0 = kv * G + hg * kH, nq = min(kH, G - hg * kH);  // the group's first q head, its heads
    const int keys = p.start + i + 1, lo = sp * p.split_keys, hi = min(keys, lo + p.split_keys);
    const int warp = g.tid / 32, lane = g.tid % 32;
    float* q_s = reinterpret_cast<float*>(smem_raw);  // [kH][hd]
    float* sm = q_s + kH * hd;                        // [warp][kH][2 + hd]
    for (int x = g.tid; x < kH * hd; x += kDraftAttnThreads) {
      const int hq = x / hd, d = x % hd;
      q_s[x] = hq < nq ? p.q[int64_t(i) * p.ld_q + int64_t(h0 + hq) * hd + d] : 0.f;
    }
    g.sync();
    const bool vec = hd % 4 == 0;
    float m[kH], l[kH], acc[kH][kT];
#pragma unroll
    for (int hq = 0; hq < kH; ++hq) {
      m[hq] = -INFINITY, l[hq] = 0.f;
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[hq][t] = 0.f;
    }
    for (int t0 = lo + warp * 32; t0 < hi; t0 += kWarps * 32) {
      // q.k: lane = key, one read of its row for the group's heads
      const int j = t0 + lane;
      const bool live = j < hi;
      float a[kH];
#pragma unroll
      for (int hq = 0; hq < kH; ++hq) a[hq] = 0.f;
      if (live) {
        const float* kr = p.k_cache + int64_t(j) * kd + int64_t(kv) * hd;
        if (vec) {
          const float4* k4 = reinterpret_cast<const float4*>(kr);
#pragma unroll 4
          for (int d4 = 0; d4 < hd / 4; ++d4) {
            const float4 x = k4[d4];
#pragma unroll
            for (int hq = 0; hq < kH; ++hq) {
              const float4 qv = reinterpret_cast<const float4*>(q_s + hq * hd)[d4];
              a[hq] = fmaf(qv.x, x.x, a[hq]);
              a[hq] = fmaf(qv.y, x.y, a[hq]);
              a[hq] = fmaf(qv.z, x.z, a[hq]);
              a[hq] = fmaf(qv.w, x.w, a[hq]);
            }
          }
        } else {
#pragma unroll 4
          for (int d = 0; d < hd; ++d) {
            const float x = kr[d];
#pragma unroll
            for (int hq = 0; hq < kH; ++hq) a[hq] = fmaf(q_s[hq * hd + d], x, a[hq]);
          }
        }
      }
      // the tile's online-softmax step per head (lane 0's key is always live: t0 < hi)
      float e[kH];
#pragma unroll
      for (int hq = 0; hq < kH; ++hq) {
        const float sc = live ? a[hq] * p.scale : -INFINITY;
        float tm = sc;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
        const float mn = fmaxf(m[hq], tm), corr = expf(m[hq] - mn);
        e[hq] = live ? expf(sc - mn) : 0.f;
        float es = e[hq];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) es += __shfl_xor_sync(0xffffffffu, es, o);
        l[hq] = l[hq] * corr + es;
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[hq][t] *= corr;
        m[hq] = mn;
      }
      // p.V: lane = channels lane + 32 t, one read of each value row for the group's heads
      const int nk = min(32, hi - t0);
#pragma unroll 4
      for (int c = 0; c < nk; ++c) {
        const float* vr = p.v_cache + int64_t(t0 + c) * kd + int64_t(kv) * hd;
        float vv[kT];
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          const int d = lane + 32 * t;
          vv[t] = d < hd ? vr[d] : 0.f;
        }
#pragma unroll
        for (int hq = 0; hq < kH; ++hq) {
          const float pc = __shfl_sync(0xffffffffu, e[hq], c);
#pragma unroll
          for (int t = 0; t < kT; ++t) acc[hq][t] = fmaf(pc, vv[t], acc[hq][t]);
        }
      }
    }
    // the warps' states in shared memory, folded by every thread for its (head, channel)s
#pragma unroll
    for (int hq = 0; hq < kH; ++hq) {
      float* mine = sm + (warp * kH + hq) * (2 + hd);
      if (lane == 0) mine[0] = m[hq], mine[1] = l[hq];
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const int d = lane + 32 * t;
        if (d < hd) mine[2 + d] = acc[hq][t];
      }
    }
    g.sync();
    const int64_t part_item = item * kH;
    for (int x = g.tid; x < nq * hd; x += kDraftAttnThreads) {
      const int hq = x / hd, d = x % hd;
      float M = -INFINITY;
      for (int v = 0; v < kWarps; ++v) M = fmaxf(M, sm[(v * kH + hq) * (2 + hd)]);
      float L = 0.f, A = 0.f;
      for (int v = 0; v < kWarps; ++v) {
        const float* ws = sm + (v * kH + hq) * (2 + hd);
        if (ws[1] > 0.f) {
          const float f = expf(ws[0] - M);
          L += ws[1] * f;
          A += ws[2 + d] * f;
        }
      }
      if (p.splits == 1) {
        p.o[int64_t(i) * p.ld_o + int64_t(h0 + hq) * hd + d] = A / L;
      } else {
        float* pr = p.part + (part_item + hq) * (2 + hd);
        if (d == 0) pr[0] = M, pr[1] = L;
        pr[2 + d] = A;
      }
    }
    g.sync();  // smem reuse
  }
};

struct DraftAttnCombineOp : OpBounds<kDraftCombineThreads> {
  using Params = DraftAttnParams;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t*) {
    const int G = p.nh / p.kvh, HG = draft_attn_groups(p), hd = p.hd;
    const int i = int(item / p.nh), h = int(item % p.nh), kv = h / G, hl = h % G;
    const int64_t first = ((int64_t(i) * p.kvh + kv) * HG + hl / kDraftAttnHeads) * p.splits;
    const int hq = hl % kDraftAttnHeads;
    auto state = [&](int sp) { return p.part + ((first + sp) * kDraftAttnHeads + hq) * (2 + hd); };
    float M = -INFINITY;
    for (int sp = 0; sp < p.splits; ++sp) M = fmaxf(M, state(sp)[0]);
    for (int d = g.tid; d < hd; d += g.nthreads) {
      float L = 0.f, A = 0.f;
      for (int sp = 0; sp < p.splits; ++sp) {
        const float* st = state(sp);
        if (st[1] > 0.f) {
          const float f = expf(st[0] - M);
          L += st[1] * f;
          A += st[2 + d] * f;
        }
      }
      p.o[int64_t(i) * p.ld_o + int64_t(h) * hd + d] = A / L;
    }
  }
};

struct DraftArgmaxOp : OpBounds<kDraftArgmaxThreads> {
  using Params = DraftArgmaxParams;
  // (v, t) beats (best, bt): eagle3_greedy's rule, associative, so any order of the pairs gives it
  __device__ static bool beats(float v, int32_t t, float best, int32_t bt) {
    return v > best || (v == best && v > -INFINITY && t < bt);
  }
  __device__ static void run(const Params& p, int64_t, Group g, uint8_t*) {
    __shared__ float wb[kDraftArgmaxThreads / 32];
    __shared__ int32_t wt[kDraftArgmaxThreads / 32];
    float best = -INFINITY;
    int32_t bt = 0;
    for (int i = g.tid; i < p.n; i += g.nthreads) {
      const float v = p.logits[i];
      const int32_t t = i + (p.d2t ? p.d2t[i] : 0);
      if (beats(v, t, best, bt)) best = v, bt = t;
    }
    const int lane = g.tid % 32, warp = g.tid / 32, nw = g.nthreads / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t ot = __shfl_xor_sync(0xffffffffu, bt, o);
      if (beats(ob, ot, best, bt)) best = ob, bt = ot;
    }
    if (lane == 0) wb[warp] = best, wt[warp] = bt;
    g.sync();
    if (g.tid == 0) {
      for (int w = 1; w < nw; ++w)
        if (beats(wb[w], wt[w], best, bt)) best = wb[w], bt = wt[w];
      *p.out = bt;
    }
  }
};

struct DraftSiluOp : OpBounds<kDraftSiluThreads> {
  using Params = DraftSiluParams;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t*) {
    const int slices = draft_silu_slices(p), r = int(item / slices), c0 = int(item % slices) * kDraftSiluCols;
    const float* gu = p.gu + int64_t(r) * p.ld_gu;
    float* h = p.h + int64_t(r) * p.ld_h;
    for (int c = c0 + g.tid; c < min(p.I, c0 + kDraftSiluCols); c += g.nthreads) {
      const float x = gu[c];
      h[c] = x / (1.0f + expf(-x)) * gu[p.I + c];
    }
  }
};

}  // namespace m3::kernels
