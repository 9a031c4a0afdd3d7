// The RMS norm's halves on the device (kernels/fused_norm_params.h has the contract).
#pragma once
#include <cstdint>

#include "kernels/act_split.cuh"
#include "kernels/fused_norm_params.h"
#include "kernels/group.cuh"

namespace m3::kernels {

// A chunk's sum of r^2 from its 16 values as 16 lanes hold them (the calling half-warp, lane % 16
// = element; every lane of the half-warp calls it; lane: the caller's lane in its warp): the
// butterfly xor 8, 4, 2, 1; every lane returns the same value (each add has the same two operands
// in both lanes).
__device__ __forceinline__ float norm_chunk_halfwarp(float r, bool live, int lane) {
  float q = live ? __fmul_rn(r, r) : 0.f;  // rounded before the adds (no contraction into an fma)
  const unsigned mask = (lane & 16) ? 0xffff0000u : 0x0000ffffu;
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) q = __fadd_rn(q, __shfl_xor_sync(mask, q, m, 16));
  return q;
}

// The same sum from a chunk held as float4s by 4 consecutive lanes (lane % 4 = float4 j of the
// chunk, elements 4j .. 4j + 3): xor 8 is lane ^ 2, xor 4 lane ^ 1, xor 2 and 1 inside the float4.
// Every lane of the warp calls it (zeros for absent chunks).
__device__ __forceinline__ float norm_chunk_quad(float4 r) {
  float4 q = make_float4(__fmul_rn(r.x, r.x), __fmul_rn(r.y, r.y), __fmul_rn(r.z, r.z), __fmul_rn(r.w, r.w));
#pragma unroll
  for (int m = 2; m >= 1; m >>= 1) {
    q.x = __fadd_rn(q.x, __shfl_xor_sync(0xffffffffu, q.x, m));
    q.y = __fadd_rn(q.y, __shfl_xor_sync(0xffffffffu, q.y, m));
    q.z = __fadd_rn(q.z, __shfl_xor_sync(0xffffffffu, q.z, m));
    q.w = __fadd_rn(q.w, __shfl_xor_sync(0xffffffffu, q.w, m));
  }
  return __fadd_rn(__fadd_rn(q.x, q.z), __fadd_rn(q.y, q.w));
}

// The same sum by one thread from the chunk's 16 values.
__device__ __forceinline__ float norm_chunk_serial(const float* r) {
  float q[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) q[e] = __fmul_rn(r[e], r[e]);
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1)
#pragma unroll
    for (int e = 0; e < m; ++e) q[e] = __fadd_rn(q[e], q[e + m]);
  return q[0];
}

// z = r * (1 + w) for element col.
__device__ __forceinline__ float norm_z(float r, const uint16_t* w, int col) {
  return __fmul_rn(r, __fadd_rn(1.0f, __uint_as_float(uint32_t(w[col]) << 16)));
}

// inv = 1 / sqrt(S / n + eps) from a row's C chunk sums s[0 .. C), by one whole warp (every lane
// returns it): lane l adds chunks l, l + 32, ... in that order, then the butterfly xor 16 .. 1.
// The loads of up to kNormInvRound chunks per lane are issued before the adds (one round trip for
// rows of up to 32 * kNormInvRound * kNormChunk values; a loop of dependent load-adds took one
// round trip per few chunks on every consumer's critical path).
constexpr int kNormInvRound = 16;
__device__ __forceinline__ float norm_inv_warp(const float* s, int C, int n, float eps, int lane) {
  float a = 0.f;
  for (int c0 = lane; c0 < C; c0 += 32 * kNormInvRound) {
    float v[kNormInvRound];
#pragma unroll
    for (int u = 0; u < kNormInvRound; ++u) v[u] = c0 + 32 * u < C ? s[c0 + 32 * u] : 0.f;
#pragma unroll
    for (int u = 0; u < kNormInvRound; ++u)
      if (c0 + 32 * u < C) a = __fadd_rn(a, v[u]);
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, m));
  return 1.0f / sqrtf(a / float(n) + eps);
}

// Fused producer: one output value v of row tk, column col (every lane of the calling half-warp
// calls it in the same step, `live` uniform over the half-warp, lane % 16 = col % 16): adds v into
// the residual stream, stores z (and its split, f.zs), and the lane of col % 16 == 0 stores the
// chunk's sum.
__device__ __forceinline__ void norm_out_element(const NormOut& f, bool live, int tk, int col, float v, int lane) {
  float r = 0.f;
  if (live) {
    float* rp = f.res + int64_t(tk) * f.ld + col;
    r = __fadd_rn(*rp, v);
    *rp = r;
    const float z = norm_z(r, f.w, col);
    f.z[int64_t(tk) * f.ld + col] = z;
    if (f.zs) store_split_element(f.zs + 2 * int64_t(tk) * f.ld, col, z);
  }
  const float q = norm_chunk_halfwarp(r, live, lane);
  if (live && col % kNormChunk == 0) f.ss[int64_t(tk) * norm_chunks(f.n) + col / kNormChunk] = q;
}

// Whether a consumer holds its tokens' inv in shared memory (norm_inv_rows): always with f.ss,
// with f.inv for up to kFusedNormMaxRows tokens (else the epilogue reads f.inv).
__device__ __forceinline__ bool norm_inv_local(const NormIn& f) {
  return f.ss || (f.inv && f.rows <= kFusedNormMaxRows);
}

// Consumer, at the start of an item: inv of tokens 0 .. f.rows - 1 into inv_s[f.rows] when
// norm_inv_local: from the chunk sums (f.ss; warp w takes tokens w, w + warps, ...) or copied from
// f.inv (so that the epilogue does not wait on a global load); the caller's next group barrier
// publishes them.
__device__ __forceinline__ void norm_inv_rows(const NormIn& f, Group g, float* inv_s) {
  if (!norm_inv_local(f)) return;
  if (!f.ss) {
    if (g.warp() == 0 && g.lane() < f.rows) inv_s[g.lane()] = f.inv[g.lane()];
    return;
  }
  const int C = norm_chunks(f.n);
  for (int t = g.warp(); t < f.rows; t += g.num_warps()) {
    const float v = norm_inv_warp(f.ss + int64_t(t) * C, C, f.n, f.eps, g.lane());
    if (g.lane() == 0) inv_s[t] = v;
  }
}

// The same as a call (not inlined): inlined after the native decode tile's walk, it made the walk
// spill (ptxas, 72 registers); called, it costs the walk nothing. (The mono kernel's bodies have
// 128 registers and inline it.)
static __device__ __noinline__ void norm_inv_rows_call(const NormIn& f, Group g, float* inv_s) {
  norm_inv_rows(f, g, inv_s);
}

// Consumer: an output value of activation row `row` (v: its linear value before any SwiGLU);
// inv_s: norm_inv_rows' shared memory, or null (walks without it: f.inv only).
__device__ __forceinline__ float norm_apply(const NormIn& f, const float* inv_s, int row, float v) {
  if (!f.ss && !f.inv) return v;
  return __fmul_rn(v, inv_s && norm_inv_local(f) ? inv_s[row] : f.inv[row]);
}

}  // namespace m3::kernels
