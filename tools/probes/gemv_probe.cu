// Probe: how fast can the batch-invariant FP8 decode projection (kernels/mma_linear.cuh: 16-row
// tiles, K in chains of 64-element blocks, bf16 hi/lo MMAs) run at M = 1 on this GPU, and what
// limits it? Variants of the same math, timed one cold launch at a time (L2 flushed before each):
//   tile  : one CTA per 16-row tile, P warps = P chains (native's decode op today), U blocks per
//           warp loaded, then computed (walk) or kept in flight while computing (rotate);
//   even  : a fixed grid of SMs x 16 warps; warp w takes chain (w mod P) of tile (w / P), so every
//           SM gets the same share; chain sums go to global memory and the last warp to finish a
//           tile adds them in chain order (a per-tile counter, epoch targets: no reset);
//   loads : the same walks with the weight loads only (no activations, decode or MMAs);
//   read  : a plain read of the same bytes (16 B per thread, grid-stride).
// Activations: fp32 from global memory per block (as native), or split once into bf16 hi / lo
// words in shared memory by the CTA before its walk ("smem").
// Build: nvcc -O3 -std=c++20 -arch=sm_90a -I src -o gemv_probe tools/probes/gemv_probe.cu
//   fma   : (2026-12-05) the projection on the CUDA cores, one warp per R rows over the whole K
//           (fma_kernel; the same bits at every M), beside the plain read and the tiled walks.
// Run:   ./gemv_probe [reps] [fma]   (prints one line per shape and variant: median us, TB/s, bits;
//        `fma`: only the fma rows and what they are compared with)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/mma_linear.cuh"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));           \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

using namespace m3::kernels;
using namespace m3::kernels::mma;

struct Shape {
  const char* name;
  int N, K;
};

struct Args {
  const uint8_t* w;
  const float* scale;
  const float* x;
  float* y;
  float* part;        // [tiles][P][16] (even mode)
  unsigned* count;    // [tiles] (even mode)
  int N, K, P;
  unsigned epoch;
  int tiled;          // 1: weights in the tiled layout (timing only: the values then differ)     // even mode: this launch's counter target is epoch * P
};

enum class Walk { Walk, Rotate, Loads };
enum class Act { Global, Smem };
// What a block computes: the shipped bf16 path; the same without the E4M3 decode (raw codes as
// operands: wrong values, same structure); decode and activations without the MMAs; or the
// hardware e4m3x2 -> f16x2 conversion with f16 MMAs and f16 hi / lo activations (Smem only).
enum class Cmp { Bf16, NoDecode, NoMma, F16 };

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t two) {
  uint32_t h2;
  asm("{cvt.rn.f16x2.e4m3x2 %0, %1;}\n" : "=r"(h2) : "h"(uint16_t(two & 0xffffu)));
  return h2;
}
__device__ __forceinline__ void split_f16(float e0, float e1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(e0, e1);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(__fsub_rn(e0, hf.x), __fsub_rn(e1, hf.y));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Activations of one block for lane (g, t): fp32 from global, or hi/lo bf16x2 words from shared
// memory (xs: [K/4][2] uint2 {hi0, hi1} / {lo0, lo1} per 4 elements).
template <Act A>
__device__ __forceinline__ void block_act(const float* x, const uint4* xs, int kc, bool tok, uint32_t (&bh)[4][2],
                                          uint32_t (&bl)[4][2]) {
  if constexpr (A == Act::Global) {
    act_run<ActFmt::F32, true>(reinterpret_cast<const uint8_t*>(x), tok, kc, 1 << 30, bh, bl);
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 v = xs[(kc >> 2) + s];  // {hi0, hi1, lo0, lo1} of elements kc + 4s .. + 3
      bh[s][0] = tok ? v.x : 0u;
      bh[s][1] = tok ? v.y : 0u;
      bl[s][0] = tok ? v.z : 0u;
      bl[s][1] = tok ? v.w : 0u;
    }
  }
}

template <Act A, Cmp C = Cmp::Bf16>
__device__ __forceinline__ void block_compute(const WRun<WeightFmt::FP8>& wr, const float* x, const uint4* xs, int kc,
                                              bool tok, float (&chain)[1][1][4]) {
  uint32_t bh[4][2], bl[4][2];
  block_act<A>(x, xs, kc, tok, bh, bl);
  float blk[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
  if constexpr (C == Cmp::Bf16) {
    const WRun<WeightFmt::FP8> w1[1] = {wr};
    block_steps_1tok<WeightFmt::FP8, ActFmt::F32, 1>(w1, bh, bl, blk);
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t w0 = s == 0 ? wr.v[0][0].x : s == 1 ? wr.v[0][0].y : s == 2 ? wr.v[0][0].z : wr.v[0][0].w;
      const uint32_t w8 = s == 0 ? wr.v[1][0].x : s == 1 ? wr.v[1][0].y : s == 2 ? wr.v[1][0].z : wr.v[1][0].w;
      uint32_t a[4];
      if constexpr (C == Cmp::NoDecode) {
        a[0] = w0, a[2] = w0 >> 8, a[1] = w8, a[3] = w8 >> 8;
      } else if constexpr (C == Cmp::F16) {
        a[0] = e4m3x2_f16x2(w0), a[2] = e4m3x2_f16x2(w0 >> 16), a[1] = e4m3x2_f16x2(w8), a[3] = e4m3x2_f16x2(w8 >> 16);
      } else {
        e4m3x4_to_bf16x2(w0, a[0], a[2]);
        e4m3x4_to_bf16x2(w8, a[1], a[3]);
      }
      if constexpr (C == Cmp::NoMma) {
        blk[0][0][0] = __int_as_float(__float_as_int(blk[0][0][0]) ^ a[0] ^ a[1] ^ bh[s][0] ^ bl[s][0]);
        blk[0][0][2] = __int_as_float(__float_as_int(blk[0][0][2]) ^ a[2] ^ a[3] ^ bh[s][1] ^ bl[s][1]);
      } else if constexpr (C == Cmp::F16) {
        mma_f16(blk[0][0], a, bh[s][0], bh[s][1]);
        mma_f16(blk[0][0], a, bl[s][0], bl[s][1]);
      } else {
        mma_bf16(blk[0][0], a, bh[s][0], bh[s][1]);
        mma_bf16(blk[0][0], a, bl[s][0], bl[s][1]);
      }
    }
  }
  add_into<1, 1>(chain, blk);
}

// Block b of the lane's two rows: row[h] + b * stride (row-major: the row start + 16 t, stride 64;
// tiled: the tile's block-major copy, stride 1024).
__device__ __forceinline__ void load_block(WRun<WeightFmt::FP8>& r, const uint8_t* const (&row)[2], bool live, int b,
                                           int stride) {
#pragma unroll
  for (int h = 0; h < 2; ++h) r.v[h][0] = live ? wstream::ld_stream(row[h] + int64_t(b) * stride) : make_uint4(0, 0, 0, 0);
}
// The same without a branch around the load: a dead block loads block `last` (in bounds) and is
// zeroed after (a select), so the compiler has no basic block to sink the load into.
__device__ __forceinline__ void load_block_nb(WRun<WeightFmt::FP8>& r, const uint8_t* const (&row)[2], bool live, int b,
                                              int last, int stride) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint4 v = wstream::ld_stream(row[h] + int64_t(live ? b : last) * stride);
    r.v[h][0] = live ? v : make_uint4(0, 0, 0, 0);
  }
}

// One chain (blocks [blo, bhi)) of the tile at rows n0.. for lane (g, t); K a multiple of 64.
// between(): called once after the first loads are issued (the activations' staging, which
// synchronizes the CTA); every thread of the CTA calls walk_chain.
// NB: walk rounds without a branch between blocks (a dead block past the chain loads zeros and
// adds +0), so the compiler may interleave a round's blocks.
// GUARD: after a round's loads, one value built from every loaded register is compared with an
// impossible one (a.epoch never holds it in tile mode): the compiler must have every load of the
// round issued before block 0's compute starts.
template <Walk WK, Act A, int U, Cmp C, bool EARLY, class Between, bool NB = false, bool GUARD = false>
__device__ __forceinline__ void walk_chain(const Args& a, const uint4* xs, int n0, int blo, int bhi, int lane,
                                           float (&chain)[1][1][4], uint32_t& sink, Between between) {
  const int g = lane >> 2, t = lane & 3;
  // a.P >= 1000: the tiled layout (each 16-row tile stored block-major: [tile][block][16 rows][64 B])
  const bool tiled = a.tiled != 0;
  const int stride = tiled ? 1024 : 64;
  const int64_t tile_base = int64_t(n0 / 16) * (a.K / 64) * 1024;
  const uint8_t* row[2] = {tiled ? a.w + tile_base + g * 64 + 16 * t : a.w + int64_t(n0 + g) * a.K + 16 * t,
                           tiled ? a.w + tile_base + (g + 8) * 64 + 16 * t : a.w + int64_t(n0 + g + 8) * a.K + 16 * t};
  const bool tok = g == 0;
  zero<1, 1>(chain);
  WRun<WeightFmt::FP8> wr[U];
  if constexpr (WK == Walk::Rotate) {
#pragma unroll
    for (int u = 0; u < U; ++u) load_block(wr[u], row, blo + u < bhi, blo + u, stride);
    between();
    for (int b = blo; b < bhi; b += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b + u >= bhi) break;
        block_compute<A, C>(wr[u], a.x, xs, (b + u) * 64 + 16 * t, tok, chain);
        load_block(wr[u], row, b + u + U < bhi, b + u + U, stride);
      }
    }
  } else {
    if (!EARLY) between();
    for (int b = blo; b < bhi; b += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (NB) load_block_nb(wr[u], row, b + u < bhi, b + u, bhi - 1, stride);
        else load_block(wr[u], row, b + u < bhi, b + u, stride);
      }
      if (EARLY && b == blo) between();
      if constexpr (GUARD) {
        uint32_t any = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) any ^= wr[u].v[0][0].x ^ wr[u].v[1][0].x;
        if (any == a.epoch + 0x9e3779b9u && a.epoch == 0xffffffffu) asm volatile("trap;");
      }  // the first loads are in flight while the CTA stages
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (NB) {
          if constexpr (WK == Walk::Loads) {
            sink ^= wr[u].v[0][0].x ^ wr[u].v[0][0].w ^ wr[u].v[1][0].y ^ wr[u].v[1][0].z;
          } else {
            block_compute<A, C>(wr[u], a.x, xs, (b + u) * 64 + 16 * t, tok && b + u < bhi, chain);
          }
          continue;
        }
        if (b + u >= bhi) break;
        if constexpr (WK == Walk::Loads) {
          sink ^= wr[u].v[0][0].x ^ wr[u].v[0][0].w ^ wr[u].v[1][0].y ^ wr[u].v[1][0].z;
        } else {
          block_compute<A, C>(wr[u], a.x, xs, (b + u) * 64 + 16 * t, tok, chain);
        }
      }
    }
  }
}

// The CTA's split activations in shared memory (every thread helps; one __syncthreads).
template <Act A, Cmp C = Cmp::Bf16>
__device__ __forceinline__ const uint4* stage_act(const Args& a, uint4* xs) {
  if constexpr (A == Act::Smem) {
    for (int i = threadIdx.x; i < a.K / 4; i += blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(a.x) + i);
      uint32_t h0, l0, h1, l1;
      if constexpr (C == Cmp::F16) {
        split_f16(v.x, v.y, h0, l0);
        split_f16(v.z, v.w, h1, l1);
      } else {
        split_hi_lo(v.x, v.y, h0, l0);
        split_hi_lo(v.z, v.w, h1, l1);
      }
      xs[i] = make_uint4(h0, h1, l0, l1);
    }
    __syncthreads();
  }
  return xs;
}

// tile mode: blockIdx.x = tile, warp j = chain j.
// OPT bits: 1 the row scale loaded at the start (not after the chains); 2 the first loads issued
// before the activations are staged (walk); 4 loads only, with the epilogue run on the sink;
// 8 walk rounds without a branch between blocks; 16 a guard that makes every load of a round issue
// before the round's compute (SASS: without it ptxas sinks blocks 1..U-1's loads below block 0's
// MMAs).
template <Walk WK, Act A, int U, Cmp C = Cmp::Bf16, int OPT = 0>
__global__ void __launch_bounds__(512) tile_kernel(Args a) {
  extern __shared__ uint4 smem[];
  float* part = reinterpret_cast<float*>(smem);  // [P][16]
  uint4* xs = smem + 64;                         // after 1 KB of partials
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n0 = blockIdx.x * 16;
  const int blocks = a.K / 64;
  float row_scale = 0.f;
  if ((OPT & 1) && threadIdx.x < 16) row_scale = __ldg(a.scale + n0 + threadIdx.x);
  float chain[1][1][4];
  uint32_t sink = 0;
  // (rotate) the first weight loads are issued before the activations are staged
  auto stage = [&] { stage_act<A, C>(a, xs); };
  walk_chain<WK, A, U, C, (OPT & 2) != 0, decltype(stage), (OPT & 8) != 0, (OPT & 16) != 0>(
      a, xs, n0, chain_begin(warp, blocks, a.P), chain_begin(warp + 1, blocks, a.P), lane, chain, sink, stage);
  if (WK == Walk::Loads && !(OPT & 4)) {
    if (sink == 0x9e3779b9u) a.y[0] = 1.f;
    return;
  }
  if (WK == Walk::Loads) chain[0][0][0] = chain[0][0][2] = __uint_as_float(sink & 0x3fffffffu);
  const int g = lane >> 2, t = lane & 3;
  if (t == 0) {
    part[warp * 16 + g] = chain[0][0][0];
    part[warp * 16 + g + 8] = chain[0][0][2];
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    float tot = part[threadIdx.x];
    for (int j = 1; j < a.P; ++j) tot = __fadd_rn(tot, part[j * 16 + threadIdx.x]);
    const int n = n0 + threadIdx.x;
    a.y[n] = __fmul_rn(tot, (OPT & 1) ? row_scale : a.scale[n]);
  }
}

// even mode: warp w (global) = chain w % P of tile w / P; the last warp of a tile adds the partials.
template <Walk WK, Act A, int U, Cmp C = Cmp::Bf16>
__global__ void __launch_bounds__(512) even_kernel(Args a) {
  extern __shared__ uint4 smem[];
  uint4* xs = smem;
  const int lane = threadIdx.x & 31;
  const int gw = int(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int tiles = a.N / 16, blocks = a.K / 64;
  if (gw >= tiles * a.P) {
    stage_act<A, C>(a, xs);
    return;
  }
  const int tile = gw / a.P, j = gw % a.P, n0 = tile * 16;
  float chain[1][1][4];
  uint32_t sink = 0;
  walk_chain<WK, A, U, C, false>(a, xs, n0, chain_begin(j, blocks, a.P), chain_begin(j + 1, blocks, a.P), lane, chain, sink,
                       [&] { stage_act<A, C>(a, xs); });
  if (WK == Walk::Loads) {
    if (sink == 0x9e3779b9u) a.y[0] = 1.f;
    return;
  }
  const int g = lane >> 2, t = lane & 3;
  float* mine = a.part + (int64_t(tile) * a.P + j) * 16;
  if (t == 0) {
    mine[g] = chain[0][0][0];
    mine[g + 8] = chain[0][0][2];
  }
  __syncwarp();
  unsigned prev = 0;
  if (lane == 0) {
    __threadfence();
    prev = atomicAdd(a.count + tile, 1u);
  }
  prev = __shfl_sync(0xffffffffu, prev, 0);
  if (prev + 1 != a.epoch * unsigned(a.P)) return;
  __threadfence();
  if (lane < 16) {
    const float* tp = a.part + int64_t(tile) * a.P * 16;
    float tot = __ldcg(tp + lane);
    for (int c = 1; c < a.P; ++c) tot = __fadd_rn(tot, __ldcg(tp + c * 16 + lane));
    const int n = n0 + lane;
    a.y[n] = __fmul_rn(tot, a.scale[n]);
  }
}

// fma mode (2026-12-05): the projection on the CUDA cores instead of the tensor cores. Warp w owns
// rows w*R .. w*R + R - 1 over the whole K; lane l takes the 16-byte runs l, l + 32, ... of each
// row (row-major), U runs a row in flight; every code is decoded exactly (e4m3x2 -> f16x2 -> f32)
// and multiplied into one fp32 accumulator per (row, token) in a fixed order (runs ascending,
// elements ascending), then the warp's 32 partials are added by a fixed butterfly and scaled. The
// order depends on K only, never on M: token t's result is the same bits at every M.
// x: [M][K] fp32; y: [M][N].
__device__ __forceinline__ void fma_run(const uint4& w, const float* xk, float& acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 xv = __ldg(reinterpret_cast<const float4*>(xk) + q);
    const uint32_t lo = e4m3x2_f16x2(ws[q]), hi = e4m3x2_f16x2(ws[q] >> 16);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    acc = __fmaf_rn(a.x, xv.x, acc);
    acc = __fmaf_rn(a.y, xv.y, acc);
    acc = __fmaf_rn(b.x, xv.z, acc);
    acc = __fmaf_rn(b.y, xv.w, acc);
  }
}
template <int M, int R, int U>
__global__ void __launch_bounds__(256) fma_kernel(Args a) {
  const int lane = threadIdx.x & 31;
  const int w = int(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int n0 = w * R;
  if (n0 >= a.N) return;
  const int runs = a.K / 16;  // 16-byte runs a row
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  for (int j0 = lane; j0 < runs; j0 += 32 * U) {
    uint4 wv[R][U];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int j = j0 + 32 * u;
        wv[r][u] = j < runs ? wstream::ld_stream(a.w + int64_t(n0 + r) * a.K + 16 * j) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + 32 * u;
      if (j >= runs) break;
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) fma_run(wv[r][u], a.x + int64_t(m) * a.K + 16 * j, acc[r][m]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      acc[r][m] = v;
    }
  if (lane < R) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r == lane) {
        const float sc = a.scale[n0 + r];
#pragma unroll
        for (int m = 0; m < M; ++m) a.y[int64_t(m) * a.N + n0 + r] = __fmul_rn(acc[r][m], sc);
      }
  }
}

__global__ void empty_kernel(float* y) {
  if (threadIdx.x == 9999) y[0] = 1.f;
}

__global__ void read_kernel(const uint4* p, int64_t n, uint4* out) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = wstream::ld_stream(p + i);
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  if (acc.x == 0x9e3779b9u) out[0] = acc;
}

struct Timer {
  cudaEvent_t a, b;
  uint8_t* flush;
  size_t fbytes = size_t(256) << 20;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMalloc(&flush, fbytes));
  }
  template <class F>
  double median_us(F launch, int reps) {
    std::vector<float> t;
    for (int r = 0; r < reps + 3; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, fbytes));
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (r >= 3) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const bool fma_only = argc > 2 && std::strcmp(argv[2], "fma") == 0;  // the fma rows and their comparisons
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, reps %d (median of cold launches, L2 flushed)\n", prop.name, sms, reps);
  const Shape shapes[] = {{"qkv tp4", 2560, 6144}, {"o tp4", 6144, 2048}};
  Timer tm;
  std::mt19937 rng(12345);
  std::printf("%-8s %-34s %8s %7s %9s %s\n", "shape", "variant", "us", "TB/s", "max rel", "bits vs first of same P");
  for (const Shape& s : shapes) {
    const int64_t wbytes = int64_t(s.N) * s.K;
    std::vector<uint8_t> hw(wbytes);
    for (auto& b : hw) {
      uint8_t v = uint8_t(rng());
      if ((v & 0x7f) == 0x7f) v ^= 1;  // no NaN codes
      b = v;
    }
    std::vector<float> hx(4 * s.K), hs(s.N);  // 4 token rows (fma M = 4); token 0 is the reference's
    std::uniform_real_distribution<float> ux(-1.f, 1.f), us(0.001f, 0.01f);
    for (auto& v : hx) v = ux(rng);
    for (auto& v : hs) v = us(rng);
    // reference in double
    std::vector<double> ref(s.N);
    for (int n = 0; n < s.N; ++n) {
      double acc = 0;
      for (int k = 0; k < s.K; ++k) {
        // E4M3 decode
        const uint8_t c = hw[int64_t(n) * s.K + k];
        const int sign = c >> 7, e = (c >> 3) & 15, m = c & 7;
        const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
        acc += (sign ? -v : v) * hx[k];
      }
      ref[n] = acc * hs[n];
    }
    uint8_t* w;
    float *x, *sc, *y, *part;
    unsigned* cnt;
    CK(cudaMalloc(&w, wbytes));
    CK(cudaMalloc(&x, 4 * s.K * 4));
    CK(cudaMalloc(&sc, s.N * 4));
    CK(cudaMalloc(&y, 4 * s.N * 4));
    const int tiles = s.N / 16;
    CK(cudaMalloc(&part, size_t(tiles) * 32 * 16 * 4));
    CK(cudaMalloc(&cnt, tiles * 4));
    CK(cudaMemcpy(w, hw.data(), wbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), 4 * s.K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sc, hs.data(), s.N * 4, cudaMemcpyHostToDevice));
    uint4* out;
    CK(cudaMalloc(&out, 16));
    const double gb = double(wbytes) / 1e3;  // bytes / 1e3 per us = GB/s... printed as TB/s below
    {
      const double t = tm.median_us([&] { read_kernel<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), wbytes / 16, out); }, reps);
      std::printf("%-8s %-34s %8.2f %7.2f\n", s.name, "read (plain)", t, gb / t / 1e3);
    }
    const int native_p = mma_linear_chains(s.N, s.K, sms);
    std::vector<std::vector<float>> firsts(128);
    auto check = [&](int P, const char* label, double t, bool loads) {
      std::vector<float> hy(s.N);
      CK(cudaMemcpy(hy.data(), y, s.N * 4, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int n = 0; n < s.N; ++n)
        worst = std::max(worst, std::fabs(hy[n] - ref[n]) / (std::fabs(ref[n]) + 1e-3));
      std::string bits = "-";
      if (!loads) {
        if (firsts[P].empty()) {
          firsts[P] = hy;
          bits = "first";
        } else {
          bits = std::memcmp(firsts[P].data(), hy.data(), s.N * 4) == 0 ? "same" : "DIFFER";
        }
      }
      std::printf("%-8s %-34s %8.2f %7.2f %9.2e %s\n", s.name, label, t, gb / t / 1e3, loads ? 0.0 : worst, bits.c_str());
    };
    auto run_tile = [&](auto kern, int Pk, const char* label, bool loads, bool smem, int tiled = 0) {
      const int P = Pk % 100;
      Args a{w, sc, x, y, part, cnt, s.N, s.K, P, 0, tiled};
      const int sbytes = 1024 + (smem ? s.K * 4 : 0);
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, sbytes));
      CK(cudaMemset(y, 0xff, s.N * 4));
      const double t = tm.median_us([&] { kern<<<tiles, 32 * P, sbytes>>>(a); }, reps);
      CK(cudaGetLastError());
      char buf[96];
      std::snprintf(buf, sizeof buf, "tile P=%d %s", P, label);
      check(Pk % 64, buf, t, loads);
    };
    unsigned epoch = 0;
    auto run_even = [&](auto kern, int P, const char* label, bool loads, bool smem) {
      const int sbytes = smem ? s.K * 4 : 0;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, std::max(sbytes, 1)));
      CK(cudaMemset(cnt, 0, tiles * 4));
      epoch = 0;
      CK(cudaMemset(y, 0xff, s.N * 4));
      const double t = tm.median_us(
          [&] {
            ++epoch;
            Args a{w, sc, x, y, part, cnt, s.N, s.K, P, epoch, 0};
            kern<<<sms, 512, sbytes>>>(a);
          },
          reps);
      CK(cudaGetLastError());
      char buf[96];
      std::snprintf(buf, sizeof buf, "even P=%d %s", P, label);
      check(P, buf, t, loads);
    };
    {
      const double t = tm.median_us([&] { empty_kernel<<<tiles, 256>>>(y); }, reps);
      std::printf("%-8s %-34s %8.2f   (launch + events: subtract from the rows below)\n", s.name, "empty kernel", t);
    }
    // The variants of docs/perf.md (2026-12-03 12:22-13:30 UTC); OPT bits in tile_kernel's comment.
    const int P = native_p;
    using W = Walk;
    using G = Act;
    auto run_fma = [&](auto kern, int M, int R, int U) {
      Args a{w, sc, x, y, part, cnt, s.N, s.K, 0, 0, 0};
      CK(cudaMemset(y, 0xff, 4 * s.N * 4));
      const int warps = (s.N + R - 1) / R, grid = (warps + 7) / 8;
      const double t = tm.median_us([&] { kern<<<grid, 256>>>(a); }, reps);
      CK(cudaGetLastError());
      char buf[96];
      std::snprintf(buf, sizeof buf, "fma M=%d R=%d U=%d", M, R, U);
      check(90, buf, t, false);  // every fma variant: the same bits for token 0
    };
    if (fma_only) {
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 1>, P, "TILED walk U=3 scale early (native)", true, false, 1);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 1>, 16, "TILED walk U=3 scale early", true, false, 1);
      run_fma(fma_kernel<1, 1, 4>, 1, 1, 4);
      run_fma(fma_kernel<1, 1, 8>, 1, 1, 8);
      run_fma(fma_kernel<1, 2, 4>, 1, 2, 4);
      run_fma(fma_kernel<1, 4, 2>, 1, 4, 2);
      run_fma(fma_kernel<1, 4, 4>, 1, 4, 4);
      run_fma(fma_kernel<2, 2, 4>, 2, 2, 4);
      run_fma(fma_kernel<4, 1, 4>, 4, 1, 4);
      run_fma(fma_kernel<4, 2, 4>, 4, 2, 4);
      run_fma(fma_kernel<4, 4, 2>, 4, 4, 2);
    }
    if (!fma_only) {
      run_tile(tile_kernel<W::Walk, G::Global, 3>, P, "walk U=3 (native)", false, false);
      run_tile(tile_kernel<W::Loads, G::Global, 3>, P, "loads only U=3", true, false);
      run_tile(tile_kernel<W::Loads, G::Global, 3, Cmp::Bf16, 4>, P, "loads only U=3 + epilogue", true, false);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 1>, P, "walk U=3 scale early", false, false);
      run_tile(tile_kernel<W::Walk, G::Smem, 3, Cmp::Bf16, 3>, P, "walk U=3 smem-act early, scale early", false, true);
      run_tile(tile_kernel<W::Walk, G::Smem, 3, Cmp::NoDecode, 3>, P, "... no decode", true, true);
      run_tile(tile_kernel<W::Walk, G::Smem, 3, Cmp::NoMma, 3>, P, "... no MMAs", true, true);
      run_tile(tile_kernel<W::Walk, G::Smem, 3, Cmp::F16, 3>, 100 + P, "... f16 decode and MMAs", false, true);
      run_tile(tile_kernel<W::Rotate, G::Smem, 3, Cmp::Bf16, 1>, P, "rotate U=3 smem-act, scale early", false, true);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 9>, P, "walk U=3 scale early, no branch", false, false);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 17>, P, "walk U=3 guard, scale early", false, false);
      run_tile(tile_kernel<W::Loads, G::Global, 3>, P, "TILED loads only U=3", true, false, 1);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 1>, P, "TILED walk U=3 scale early", true, false, 1);
      run_tile(tile_kernel<W::Walk, G::Global, 3>, 16, "walk U=3", false, false);
      run_tile(tile_kernel<W::Walk, G::Global, 3, Cmp::Bf16, 1>, 16, "TILED walk U=3 scale early", true, false, 1);
    }
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(sc));
    CK(cudaFree(y));
    CK(cudaFree(part));
    CK(cudaFree(cnt));
    CK(cudaFree(out));
  }
  return 0;
}
