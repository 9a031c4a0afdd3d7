// Fused per-head norm + partial NeoX RoPE + cache insert, for any number of tokens.
//
// Input, per token t, the fused projection row (fp32) proj[t * proj_stride + ...]:
//   [ q: H x D | k: KV x D | v: KV x D | iq: IH x ID | ik: ID ]   (iq/ik only when IH > 0)
// Per vector x (one head):
//   q, k, iq, ik:  y = x / sqrt(mean(x^2) + eps) * (1 + w)  (Gemma norm; one weight per kind,
//                  shared by all heads), then RoPE on channels [0, R): with r = R/2 and
//                  a_i = fp32(p * inv_freq[i]),  y_i' = y_i cos a_i - y_{i+r} sin a_i,
//                  y_{i+r}' = y_{i+r} cos a_i + y_i sin a_i; channels >= R pass through.
//   v:             stored as is.
// Outputs: q -> q_out [T, H*D] fp32, iq -> iq_out [T, IH*ID] fp32; k, v -> main caches at the
// token's slot (layout in native/kv_cache.h) as e(x * inv_scale); ik -> index-K cache likewise.
// Rows with slot < 0 (padding) write no cache entry; their q/iq rows are still written.
//
// Work item w = one (token, vector) pair, executed by one warp: w = t * nvec + v with
// nvec = H + 2 KV (+ IH + 1 on sparse layers), vectors ordered q heads, k heads, v heads, iq
// heads, ik. Lane l owns the rotary pairs (i, i + r) for i = l + 32 j and the pass-through
// channels R + l + 32 j, so the norm is one warp sum and the rotation needs no exchange.
#pragma once
#include <cstdint>

#include "kernels/attention_common.cuh"
#include "kernels/qk_norm_rope_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {


template <class KvC, class IkC>
__device__ void qk_norm_rope_cache_work(int64_t w, int lane, const QkNormRopeCacheParams& p) {
  // Latency is what this costs at decode: every load (slot, position, the vector, its norm weights,
  // the frequencies) is issued before anything waits on one, and the angles are computed while
  // the vector is in flight; padding K/V/IK vectors are computed too and only their stores are
  // skipped (an early return on the slot made the vector's loads wait for the slot's).
  // num_work() < 2^31 (checked by the builder): 32-bit item arithmetic.
  const int nvec = p.vectors_per_token();
  const int t = int(w) / nvec, vec = int(w) - t * nvec;
  const int H = p.num_heads, KV = p.kv_heads, D = p.head_dim, ID = p.index_dim;
  const float* row = p.proj + int64_t(t) * p.proj_stride;

  enum Kind { Q, K, V, IQ, IK };
  Kind kind;
  int head = 0, dim = D;
  const float* src;
  const float* nw = nullptr;
  if (vec < H) {
    kind = Q; head = vec; src = row + int64_t(head) * D; nw = p.q_norm;
  } else if (vec < H + KV) {
    kind = K; head = vec - H; src = row + int64_t(H + head) * D; nw = p.k_norm;
  } else if (vec < H + 2 * KV) {
    kind = V; head = vec - H - KV; src = row + int64_t(H + KV + head) * D;
  } else if (vec < H + 2 * KV + p.index_heads) {
    kind = IQ; head = vec - H - 2 * KV; dim = ID; src = row + int64_t(H + 2 * KV) * D + int64_t(head) * ID;
    nw = p.iq_norm;
  } else {
    kind = IK; dim = ID; src = row + int64_t(H + 2 * KV) * D + int64_t(p.index_heads) * ID; nw = p.ik_norm;
  }
  const int R = kind == V ? 0 : p.rotary_dim;
  const int r = R / 2;
  constexpr int kPairs = kRopeMaxDim / 2 / 32, kPass = kRopeMaxDim / 32;
  const int32_t slot = p.slots[t];
  const int32_t pos_raw = p.positions[t];
  float a[kPairs], b[kPairs], c[kPass], wa[kPairs], wb[kPairs], wc[kPass], fr[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    const bool in = i < r;
    a[j] = in ? src[i] : 0.f;
    b[j] = in ? src[i + r] : 0.f;
    wa[j] = in && nw ? nw[i] : 0.f;
    wb[j] = in && nw ? nw[i + r] : 0.f;
    fr[j] = in ? p.inv_freq[i] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPass; ++j) {
    const int d = R + lane + 32 * j;
    c[j] = d < dim ? src[d] : 0.f;
    wc[j] = d < dim && nw ? nw[d] : 0.f;
  }
  const int32_t pos = pos_raw < 0 ? 0 : pos_raw;
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) ss += a[j] * a[j] + b[j] * b[j];
#pragma unroll
  for (int j = 0; j < kPass; ++j) ss += c[j] * c[j];

  if (kind != V) {
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / float(dim) + p.eps);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      int i = lane + 32 * j;
      if (i < r) {
        float y0 = a[j] * rs * (1.0f + wa[j]);
        float y1 = b[j] * rs * (1.0f + wb[j]);
        // NOTE: the angle is the fp32 product, its cos/sin taken in double and rounded, exactly
        // as the reference (ref/rope.h) and transformers' fp32 tables do.
        float ang = float(pos) * fr[j];
        double sd, cd;
        sincos(double(ang), &sd, &cd);
        float cs = float(cd), sn = float(sd);
        a[j] = y0 * cs - y1 * sn;
        b[j] = y1 * cs + y0 * sn;
      }
    }
#pragma unroll
    for (int j = 0; j < kPass; ++j) {
      int d = R + lane + 32 * j;
      if (d < dim) c[j] = c[j] * rs * (1.0f + wc[j]);
    }
  }
  if ((kind == K || kind == V || kind == IK) && slot < 0) return;  // padding: no cache write

  // Destination.
  if (kind == Q || kind == IQ) {
    float* dst = kind == Q ? p.q_out + (int64_t(t) * H + head) * D : p.iq_out + (int64_t(t) * p.index_heads + head) * ID;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      int i = lane + 32 * j;
      if (i < r) { dst[i] = a[j]; dst[i + r] = b[j]; }
    }
#pragma unroll
    for (int j = 0; j < kPass; ++j) {
      int d = R + lane + 32 * j;
      if (d < dim) dst[d] = c[j];
    }
  } else if (kind == K || kind == V) {
    using S = typename KvC::Store;
    S* dst = static_cast<S*>(kind == K ? p.k_cache : p.v_cache) + (int64_t(slot) * KV + head) * D;
    const float inv = kind == K ? p.k_inv_scale : p.v_inv_scale;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      int i = lane + 32 * j;
      if (i < r) { dst[i] = KvC::encode(a[j] * inv); dst[i + r] = KvC::encode(b[j] * inv); }
    }
#pragma unroll
    for (int j = 0; j < kPass; ++j) {
      int d = R + lane + 32 * j;
      if (d < dim) dst[d] = KvC::encode(c[j] * inv);
    }
  } else {
    using S = typename IkC::Store;
    S* dst = static_cast<S*>(p.ik_cache) + int64_t(slot) * ID;
    const float inv = p.ik_inv_scale;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      int i = lane + 32 * j;
      if (i < r) { dst[i] = IkC::encode(a[j] * inv); dst[i + r] = IkC::encode(b[j] * inv); }
    }
#pragma unroll
    for (int j = 0; j < kPass; ++j) {
      int d = R + lane + 32 * j;
      if (d < dim) dst[d] = IkC::encode(c[j] * inv);
    }
  }
}

template <class KvC, class IkC>
struct QkNormRopeCacheOp : OpBounds<32 * kRopeWarps> {
  using Params = QkNormRopeCacheParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int64_t item = w * kRopeWarps + g.warp();
    if (item < p.num_work()) qk_norm_rope_cache_work<KvC, IkC>(item, g.lane(), p);
  }
};

}  // namespace m3::kernels
