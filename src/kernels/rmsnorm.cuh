// Gemma RMS norm with the residual add fused in front (m3-model.md, "Norm"), one token row:
//   r = x + residual (or x alone),  y = r / sqrt(mean(r^2) + eps) * (1 + w)   (Llama's: * w)
// fp32 math; the sum of squares is per-thread sequential, then a fixed-order block reduction, so
// the result does not depend on timing (nor on M: one block per row, the order is set by n and NT).
// Two bodies, picked by the launcher from the shapes and alignment only: rmsnorm_row_regs (rows of
// at most NT * 4 * V floats, 16-byte aligned: every load of the row issued before any store, the
// row kept in registers) and rmsnorm_work (any row; a strided loop). Layouts: x, residual, residual_out [M][ld] fp32,
// w [n] bf16, y [M][ld_y] fp32 and/or y_bf16 [M][ld_yb] bf16 (round to nearest even).
// residual_out (r) may alias x or residual; y may alias x when there is no residual_out.
#pragma once
#include <cstdint>

#include "core/codecs.h"
#include "kernels/fused_norm.cuh"
#include "kernels/rmsnorm_params.h"
#include "kernels/weight_stream.cuh"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

// The scale a weight gives: Gemma's (1 + w), or Llama's w (the EAGLE3 draft, native/eagle3_net.h;
// never with the prep half).
template <bool Gemma>
__device__ __forceinline__ float norm_gain(float w) {
  if constexpr (Gemma) return 1.0f + w;
  else return w;
}

// Work item = row; all NT threads of group g call it. smem: NT / 32 floats.
template <int NT, bool Gemma = true>
__device__ __forceinline__ void rmsnorm_work(const RmsNormParams& p, int row, Group g, float* smem) {
  const int tid = g.tid;
  const float* x = p.x + int64_t(row) * p.ld_x;
  const float* res = p.residual ? p.residual + int64_t(row) * p.ld_res : nullptr;
  float* ro = p.residual_out ? p.residual_out + int64_t(row) * p.ld_res_out : nullptr;
  if (p.prep) {  // z = r (1 + w), then the chunk sums (one thread per chunk) and inv
    for (int i = tid; i < p.n; i += NT) {
      float r = x[i];
      if (res) r += res[i];
      if (ro) ro[i] = r;
      const float z = norm_z(r, p.w, i);
      p.y[int64_t(row) * p.ld_y + i] = z;
      if (p.y_split) store_split_element(p.y_split + 2 * int64_t(row) * p.ld_y, i, z);
    }
    g.sync();
    const int C = norm_chunks(p.n);
    for (int c = tid; c < C; c += NT) {
      float rr[kNormChunk];
#pragma unroll
      for (int e = 0; e < kNormChunk; ++e) {
        const int i = c * kNormChunk + e;
        rr[e] = ro ? ro[i] : (res ? x[i] + res[i] : x[i]);
      }
      smem[c] = norm_chunk_serial(rr);
    }
    g.sync();
    if (g.warp() == 0) {
      const float inv = norm_inv_warp(smem, C, p.n, p.eps, g.lane());
      if (g.lane() == 0) p.inv[row] = inv;
    }
    g.sync();  // smem reuse
    return;
  }
  float ss = 0.f;
  for (int i = tid; i < p.n; i += NT) {
    float r = x[i];
    if (res) r += res[i];
    if (ro) ro[i] = r;
    ss = fmaf(r, r, ss);
  }
  float part[1] = {ss};
  wstream::block_sum<1, NT>(part, g, smem);
  const float inv = 1.0f / sqrtf(smem[0] / float(p.n) + p.eps);
  for (int i = tid; i < p.n; i += NT) {
    const float r = ro ? ro[i] : (res ? x[i] + res[i] : x[i]);
    const float v = r * inv * norm_gain<Gemma>(bf16_to_f32(p.w[i]));
    if (p.y) p.y[int64_t(row) * p.ld_y + i] = v;
    if (p.y_bf16) p.y_bf16[int64_t(row) * p.ld_yb + i] = f32_to_bf16(v);
  }
  g.sync();  // smem reuse
}

// Row in registers: thread tid holds float4 i = tid + v * NT (v < V) of the row; sum of squares per
// thread over its float4s in v order (x, y, z, w), then the fixed block reduction.
// Needs n % 4 == 0, n / 4 <= NT * V, x / residual / residual_out / y 16-byte aligned rows,
// w and y_bf16 8-byte aligned rows. smem: NT / 32 floats.
template <int NT, int V, bool Gemma = true>
__device__ __forceinline__ void rmsnorm_row_regs(const RmsNormParams& p, int row, Group g, float* smem) {
  const int tid = g.tid;
  const int n4 = p.n / 4;
  const float4* x = reinterpret_cast<const float4*>(p.x + int64_t(row) * p.ld_x);
  const float4* res = p.residual ? reinterpret_cast<const float4*>(p.residual + int64_t(row) * p.ld_res) : nullptr;
  float4 r[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = tid + v * NT;
    r[v] = i < n4 ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // the weights do not depend on the sum: their loads are in flight with the row's
  const uint2* w = reinterpret_cast<const uint2*>(p.w);
  uint2 wv[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = tid + v * NT;
    wv[v] = i < n4 ? __ldg(w + i) : make_uint2(0, 0);
  }
  if (res) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int i = tid + v * NT;
      if (i < n4) {
        const float4 b = res[i];
        r[v].x += b.x;
        r[v].y += b.y;
        r[v].z += b.z;
        r[v].w += b.w;
      }
    }
  }
  float4* ro = p.residual_out ? reinterpret_cast<float4*>(p.residual_out + int64_t(row) * p.ld_res_out) : nullptr;
  if (p.prep) {  // z = r (1 + w); the chunk sums (4 lanes a chunk) into smem, then inv by warp 0
    float4* z = reinterpret_cast<float4*>(p.y + int64_t(row) * p.ld_y);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int i = tid + v * NT;
      const float q = norm_chunk_quad(r[v]);  // every lane (absent float4s are zeros)
      if (i >= n4) continue;
      if (ro) ro[i] = r[v];
      if ((i & 3) == 0) smem[i >> 2] = q;
      float4 o;
      o.x = __fmul_rn(r[v].x, __fadd_rn(1.0f, __uint_as_float(wv[v].x << 16)));
      o.y = __fmul_rn(r[v].y, __fadd_rn(1.0f, __uint_as_float(wv[v].x & 0xffff0000u)));
      o.z = __fmul_rn(r[v].z, __fadd_rn(1.0f, __uint_as_float(wv[v].y << 16)));
      o.w = __fmul_rn(r[v].w, __fadd_rn(1.0f, __uint_as_float(wv[v].y & 0xffff0000u)));
      z[i] = o;
      if (p.y_split) reinterpret_cast<uint4*>(p.y_split + 2 * int64_t(row) * p.ld_y)[i] = split_group4(o);
    }
    g.sync();
    if (g.warp() == 0) {
      const float inv = norm_inv_warp(smem, norm_chunks(p.n), p.n, p.eps, g.lane());
      if (g.lane() == 0) p.inv[row] = inv;
    }
    g.sync();  // smem reuse
    return;
  }
  float ss = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = tid + v * NT;
    if (i < n4) {
      if (ro) ro[i] = r[v];
      ss = fmaf(r[v].x, r[v].x, ss);
      ss = fmaf(r[v].y, r[v].y, ss);
      ss = fmaf(r[v].z, r[v].z, ss);
      ss = fmaf(r[v].w, r[v].w, ss);
    }
  }
  float part[1] = {ss};
  wstream::block_sum<1, NT>(part, g, smem);
  const float inv = 1.0f / sqrtf(smem[0] / float(p.n) + p.eps);
  float4* y = p.y ? reinterpret_cast<float4*>(p.y + int64_t(row) * p.ld_y) : nullptr;
  uint2* yb = p.y_bf16 ? reinterpret_cast<uint2*>(p.y_bf16 + int64_t(row) * p.ld_yb) : nullptr;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = tid + v * NT;
    if (i >= n4) continue;
    float4 o;
    o.x = r[v].x * inv * norm_gain<Gemma>(__uint_as_float(wv[v].x << 16));
    o.y = r[v].y * inv * norm_gain<Gemma>(__uint_as_float(wv[v].x & 0xffff0000u));
    o.z = r[v].z * inv * norm_gain<Gemma>(__uint_as_float(wv[v].y << 16));
    o.w = r[v].w * inv * norm_gain<Gemma>(__uint_as_float(wv[v].y & 0xffff0000u));
    if (y) y[i] = o;
    if (yb) yb[i] = make_uint2(uint32_t(f32_to_bf16(o.x)) | (uint32_t(f32_to_bf16(o.y)) << 16),
                               uint32_t(f32_to_bf16(o.z)) | (uint32_t(f32_to_bf16(o.w)) << 16));
  }
  g.sync();  // smem reuse
}

// The ops (kernels/work_kernel.cuh): the body picked by p.regs (native::make_rmsnorm_params); Gemma
// false: Llama's scale w.
template <bool Regs, bool Gemma = true>
struct RmsNormOp : OpBounds<kNormThreads> {
  using Params = RmsNormParams;
  __device__ static void run(const Params& p, int64_t row, Group g, uint8_t* smem) {
    if constexpr (Regs)
      rmsnorm_row_regs<kNormThreads, kNormVec, Gemma>(p, int(row), g, reinterpret_cast<float*>(smem));
    else rmsnorm_work<kNormThreads, Gemma>(p, int(row), g, reinterpret_cast<float*>(smem));
  }
};

}  // namespace m3::kernels
