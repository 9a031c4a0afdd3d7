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
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t*) {
    const int i = int(item), pos = p.start + i, half = p.hd / 2, kd = p.kvh * p.hd;
    float* row = p.qkv + int64_t(i) * p.ld;
    float* kc = p.k_cache + int64_t(pos) * kd;
    float* vc = p.v_cache + int64_t(pos) * kd;
    const float* k = row + p.nh * p.hd;
    const float* v = k + kd;
    for (int x = g.tid; x < (p.nh + p.kvh) * half; x += kDraftRopeThreads) {
      const int h = x / half, j = x % half;
      double s, c;
      sincos(double(pos) * p.inv_freq[j], &s, &c);
      const bool is_q = h < p.nh;
      const float* src = is_q ? row + h * p.hd : k + (h - p.nh) * p.hd;
      float* dst = is_q ? row + h * p.hd : kc + (h - p.nh) * p.hd;
      const double x1 = src[j], x2 = src[j + half];
      dst[j] = float(x1 * c - x2 * s);
      dst[j + half] = float(x2 * c + x1 * s);
    }
    for (int x = g.tid; x < kd; x += kDraftRopeThreads) vc[x] = v[x];
  }
};

struct DraftAttnOp : OpBounds<kDraftAttnThreads> {
  using Params = DraftAttnParams;
  static constexpr int kWarps = kDraftAttnThreads / 32, kT = kDraftAttnMaxHd / 32;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t* smem_raw) {
    const int i = int(item / p.nh), h = int(item % p.nh), kvhead = h / (p.nh / p.kvh);
    const int keys = p.start + i + 1, kd = p.kvh * p.hd;
    const int warp = g.tid / 32, lane = g.tid % 32;
    const float* q = p.q + int64_t(i) * p.ld_q + int64_t(h) * p.hd;
    float qr[kT], acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int d = lane + 32 * t;
      qr[t] = d < p.hd ? q[d] : 0.f;
      acc[t] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = warp; j < keys; j += kWarps) {
      const float* kr = p.k_cache + int64_t(j) * kd + int64_t(kvhead) * p.hd;
      float s = 0.f;
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const int d = lane + 32 * t;
        if (d < p.hd) s = fmaf(qr[t], kr[d], s);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= p.scale;
      const float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
      l = l * corr + e;
      const float* vr = p.v_cache + int64_t(j) * kd + int64_t(kvhead) * p.hd;
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const int d = lane + 32 * t;
        if (d < p.hd) acc[t] = acc[t] * corr + e * vr[d];
      }
      m = mn;
    }
    // the warps' (m, l, acc) in shared memory, combined by every thread for its dims
    float* sm = reinterpret_cast<float*>(smem_raw);
    float* mine = sm + warp * (2 + p.hd);
    if (lane == 0) mine[0] = m, mine[1] = l;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int d = lane + 32 * t;
      if (d < p.hd) mine[2 + d] = acc[t];
    }
    g.sync();
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w * (2 + p.hd)]);
    float L = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float* ws = sm + w * (2 + p.hd);
      if (ws[1] > 0.f) L += ws[1] * expf(ws[0] - M);
    }
    float* o = p.o + int64_t(i) * p.ld_o + int64_t(h) * p.hd;
    for (int d = g.tid; d < p.hd; d += kDraftAttnThreads) {
      float a = 0.f;
      for (int w = 0; w < kWarps; ++w) {
        const float* ws = sm + w * (2 + p.hd);
        if (ws[1] > 0.f) a += ws[2 + d] * expf(ws[0] - M);
      }
      o[d] = a / L;
    }
    g.sync();  // smem reuse
  }
};

struct DraftSiluOp : OpBounds<kDraftSiluThreads> {
  using Params = DraftSiluParams;
  __device__ static void run(const Params& p, int64_t item, Group g, uint8_t*) {
    const float* gu = p.gu + item * p.ld_gu;
    float* h = p.h + item * p.ld_h;
    for (int c = g.tid; c < p.I; c += kDraftSiluThreads) {
      const float x = gu[c];
      h[c] = x / (1.0f + expf(-x)) * gu[p.I + c];
    }
  }
};

}  // namespace m3::kernels
