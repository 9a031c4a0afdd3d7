// moe_forward: router GEMV, select, group, then the grouped MXFP4 expert kernels sized for the most
// entries a batch of M tokens can have (entries past the real count exit at once), then combine.
// Expert kernels: tensor cores (kernels/moe_mma.cuh; wide for decode, deep for prefill, bitwise the
// same results), or the CUDA-core GEMV of kernels/moe_mxfp4.cuh (moe_set_kernel(MoeKernel::Gemv), or
// M3_MOE_GEMV=1 in the environment: the fallback and the yardstick).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/moe_mma.cuh"
#include "kernels/moe_mxfp4.cuh"
#include "native/cuda_check.h"
#include "native/moe.h"
#include "native/router.h"

namespace m3::native {

namespace {

constexpr int kMoeWarpsPerBlock = 4;

// warp w of block b does work item b * 4 + w
template <int MT>
__global__ void __launch_bounds__(32 * kMoeWarpsPerBlock) moe_gemv_kernel(kernels::MoeGemvParams p, int items) {
  const int work = blockIdx.x * kMoeWarpsPerBlock + threadIdx.x / 32;
  if (work < items) kernels::moe_gemv_work<kernels::ActFmt::F32, MT>(p, work, threadIdx.x & 31);
}

// Tensor-core tilings: wide (decode) 32 rows x 8 pairs per CTA and P warps; deep (prefill) 32 rows
// x 32 pairs per warp (two CTAs of 4 warps per SM: up to 255 registers). Any tiling gives the same
// bits (moe_mma.cuh); these are speed choices.
// Staged wide kernel: 3 stages per warp (H200, 2026-11-30, tp4 experts: 3 and 4 stages within 3%,
// 6 slower; 10-18% faster than the register pipeline at M = 2-16, equal at M = 1).
constexpr int kWideRT = 2, kWideNT = 1, kDeepRT = 2, kDeepNT = 4, kWideStages = 3;
constexpr int kDeepCtasPerSm = 2;  // the deep kernel's launch bounds: its persistent grid is one wave

// Dynamic shared memory of the wide kernel: the chain partials, then (staged, S > 0) the warps' rings.
template <int RT, int NT>
__host__ __device__ inline size_t wide_partials_bytes(int chains) {
  return (size_t(kernels::mma::wide_smem_floats<RT, NT>(chains)) * sizeof(float) + 15) / 16 * 16;
}
template <int RT, int NT, int S>
size_t wide_smem_bytes(int chains) {
  return wide_partials_bytes<RT, NT>(chains) + size_t(chains) * size_t(S > 0 ? kernels::moe_wide_ring_bytes<RT, S>() : 0);
}

template <int RT, int NT, int U, int S>
__global__ void __launch_bounds__(32 * kernels::kMoeMaxChains) moe_wide_kernel(kernels::MoeMmaParams p) {
  extern __shared__ __align__(16) float smem[];
  uint8_t* ring = S > 0 ? reinterpret_cast<uint8_t*>(smem) + wide_partials_bytes<RT, NT>(p.chains) : nullptr;
  // entries in reverse launch order: the last real entry (the shared expert, which has every token
  // and so the most token tiles) starts first instead of last
  kernels::moe_mma_wide_work<RT, NT, U, S>(p, int(blockIdx.x), int(gridDim.y - 1 - blockIdx.y), int(threadIdx.x),
                                           smem, ring);
}

template <int RT, int NT>
__global__ void __launch_bounds__(32 * kernels::kMoeDeepWarps, kDeepCtasPerSm)
    moe_deep_kernel(kernels::MoeMmaParams p, int row_tiles) {
  constexpr int kPerWarp = kernels::mma::deep_smem_floats_per_warp<RT, NT>();
  __shared__ float smem[kernels::kMoeDeepWarps * kPerWarp];
  const int warp = int(threadIdx.x) >> 5;
  kernels::moe_mma_deep_work<RT, NT>(p, row_tiles, int(blockIdx.x) * kernels::kMoeDeepWarps + warp,
                                     int(gridDim.x) * kernels::kMoeDeepWarps, int(threadIdx.x) & 31,
                                     smem + warp * kPerWarp);
}

constexpr int kSplitThreads = 256;
// block (c, row): groups [c * 256, c * 256 + 256) of row `row`
__global__ void __launch_bounds__(kSplitThreads) moe_split_kernel(const float* x, int64_t ld_x, int K, uint16_t* xs,
                                                                  int64_t ld_xs) {
  const int G = int(blockIdx.x) * kSplitThreads + int(threadIdx.x);
  if (G < ld_xs / 16) kernels::moe_split_work(x, ld_x, K, xs, ld_xs, int(blockIdx.y), G);
}

constexpr int kCombineThreads = 256;
// block (c, t): channels [c * 256, c * 256 + 256) of token t
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(kernels::MoeCombineParams p) {
  kernels::moe_combine_work(p, int(blockIdx.y), int(blockIdx.x), int(threadIdx.x), kCombineThreads);
}

uint64_t align256(uint64_t v) { return (v + 255) / 256 * 256; }

struct Plan {  // byte offsets inside the workspace
  uint64_t logits, ids, weights, entry_slot, entry_begin, num, sh_slot, sh_begin, sh_num, pair_row, pos_of, h, y, xs,
      hs, total;
  int pairs, imax;
  int64_t ld_xs, ld_hs;  // uint16 per row of the split activations (kernels/moe_mma.cuh)
};

Plan plan(const MoeWeights& w, int M) {
  Plan p{};
  const int MK = M * w.K;
  p.pairs = MK + M;
  // h rows are read with 16-byte loads: a multiple of 4 floats
  p.imax = (std::max(w.inter(), w.shared_w2.empty() ? 0 : w.shared_w2.cols) + 3) / 4 * 4;
  uint64_t o = 0;
  auto take = [&](uint64_t bytes) {
    uint64_t at = o;
    o = align256(o + bytes);
    return at;
  };
  p.logits = take(uint64_t(M) * w.E * 4);
  p.ids = take(uint64_t(MK) * 4);
  p.weights = take(uint64_t(MK) * 4);
  p.entry_slot = take(uint64_t(w.E + 1) * 4);
  p.entry_begin = take(uint64_t(w.E + 2) * 4);
  p.num = take(4);
  p.sh_slot = take(4);
  p.sh_begin = take(8);
  p.sh_num = take(4);
  p.pair_row = take(uint64_t(p.pairs) * 4);
  p.pos_of = take(uint64_t(MK) * 4);
  p.h = take(uint64_t(p.pairs) * uint64_t(p.imax) * 4);
  p.y = take(uint64_t(p.pairs) * uint64_t(w.hidden()) * 4);
  p.ld_xs = 2 * ((int64_t(w.hidden()) + kernels::kMoeKBlock - 1) / kernels::kMoeKBlock * kernels::kMoeKBlock);
  p.ld_hs = 2 * ((int64_t(p.imax) + kernels::kMoeKBlock - 1) / kernels::kMoeKBlock * kernels::kMoeKBlock);
  p.xs = take(uint64_t(M) * uint64_t(p.ld_xs) * 2);
  p.hs = take(uint64_t(p.pairs) * uint64_t(p.ld_hs) * 2);
  p.total = o;
  return p;
}

void check_experts(const Mxfp4Experts& e, int rows, int cols, const char* what) {
  M3_CHECK(e.codes && e.scales && e.rows == rows && e.cols == cols && e.ld >= (cols + 31) / 32 * 16 &&
               e.ld % 16 == 0 && e.sld >= (cols + 31) / 32 && reinterpret_cast<uintptr_t>(e.codes) % 16 == 0,
           "moe: {} experts [{} x {}] (ld {}, sld {}) do not match [{} x {}]", what, e.rows, e.cols, e.ld, e.sld, rows,
           cols);
}

void launch_moe_gemv(const kernels::MoeGemvParams& p, int entries, int max_tokens, cudaStream_t s) {
  const int64_t items = int64_t(entries) * p.groups;
  M3_CHECK(items < (int64_t(1) << 31), "moe: {} work items", items);
  if (items == 0) return;
  const unsigned grid = unsigned((items + kMoeWarpsPerBlock - 1) / kMoeWarpsPerBlock);
  const int threads = 32 * kMoeWarpsPerBlock;
  // tokens per pass: the most any entry can have (each token meets an expert at most once)
  if (max_tokens <= 1) moe_gemv_kernel<1><<<grid, threads, 0, s>>>(p, int(items));
  else if (max_tokens <= 4) moe_gemv_kernel<4><<<grid, threads, 0, s>>>(p, int(items));
  else moe_gemv_kernel<kernels::kMoeMaxTokens><<<grid, threads, 0, s>>>(p, int(items));
  M3_LAUNCH_CHECK(s);
}

std::atomic<int> g_kernel{-1};  // MoeKernel, -1: not read from the environment yet

MoeKernel current_kernel() {
  int k = g_kernel.load();
  if (k < 0) {
    const char* e = std::getenv("M3_MOE_GEMV");
    k = int(e && std::strcmp(e, "1") == 0 ? MoeKernel::Gemv : MoeKernel::Auto);
    int expected = -1;
    g_kernel.compare_exchange_strong(expected, k);
    k = g_kernel.load();
  }
  return MoeKernel(k);
}

// One projection for the entries of a list on tensor cores: wide or deep (same bits either way).
// The wide kernel: staged (S stages per warp, cp.async) when the scale rows allow it, else the
// register pipeline (U blocks per load group); the same bits either way.
template <int RT, int U, int S = 0>
void launch_wide(const kernels::MoeMmaParams& p, int entries, cudaStream_t s) {
  constexpr int NT = kWideNT;
  const dim3 grid(unsigned((p.N + 16 * RT - 1) / (16 * RT)), unsigned(entries));
  const size_t smem = wide_smem_bytes<RT, NT, S>(p.chains);
  allow_dynamic_smem(reinterpret_cast<const void*>(moe_wide_kernel<RT, NT, U, S>), smem);
  M3_CHECK(entries < 65536, "moe: {} entries", entries);
  moe_wide_kernel<RT, NT, U, S><<<grid, unsigned(32 * p.chains), smem, s>>>(p);
}

// The staged chain needs 4-byte aligned scale rows (kernels/moe_mma.cuh).
bool stageable(const kernels::MoeMmaParams& p) {
  return p.sld % 4 == 0 && p.slot_scales % 4 == 0 && reinterpret_cast<uintptr_t>(p.scales) % 4 == 0;
}

void launch_moe_mma(kernels::MoeMmaParams p, int entries, bool deep, cudaStream_t s) {
  if (entries == 0) return;
  p.chains = kernels::moe_mma_chains(p.N, p.K, device_sm_count());
  if (!deep && stageable(p)) {
    launch_wide<kWideRT, 1, kWideStages>(p, entries, s);
  } else if (!deep) {
    launch_wide<kWideRT, kernels::moe_mma::blocks_in_flight<kWideRT, kWideNT>()>(p, entries, s);
  } else {
    constexpr int RT = kDeepRT, NT = kDeepNT;
    const int row_tiles = (p.N + 16 * RT - 1) / (16 * RT);
    const unsigned grid = unsigned(device_sm_count() * kDeepCtasPerSm);  // one resident wave
    moe_deep_kernel<RT, NT><<<grid, unsigned(32 * kernels::kMoeDeepWarps), 0, s>>>(p, row_tiles);
  }
  M3_LAUNCH_CHECK(s);
}

// The fields the tensor-core and the CUDA-core expert kernels' params share: the experts, the
// entry lists they walk, the output and the SwiGLU epilogue.
template <class P>
P expert_params(const Mxfp4Experts& e, const int32_t* slot, const int32_t* begin, const int32_t* num,
                const int32_t* pair_row, float* y, int64_t ld_y, bool swiglu, const MoeWeights& w) {
  P p;
  p.codes = e.codes;
  p.scales = e.scales;
  p.ld = e.ld;
  p.sld = e.sld;
  p.slot_codes = e.slot_codes;
  p.slot_scales = e.slot_scales;
  p.N = e.rows;
  p.K = e.cols;
  p.entry_slot = slot;
  p.entry_begin = begin;
  p.num_entries = num;
  p.pair_row = pair_row;
  p.y = y;
  p.ld_y = ld_y;
  p.swiglu = swiglu ? 1 : 0;
  p.alpha = w.alpha;
  p.limit = w.limit;
  return p;
}

kernels::MoeMmaParams mma_params(const Mxfp4Experts& e, const int32_t* slot, const int32_t* begin, const int32_t* num,
                                 const int32_t* pair_row, const uint16_t* xs, int64_t ld_xs, float* y, int64_t ld_y,
                                 uint16_t* ys, int64_t ld_ys, bool swiglu, const MoeWeights& w) {
  auto p = expert_params<kernels::MoeMmaParams>(e, slot, begin, num, pair_row, y, ld_y, swiglu, w);
  p.xs = xs;
  p.ld_xs = ld_xs;
  p.ys = ys;
  p.ld_ys = ld_ys;
  return p;
}

kernels::MoeGemvParams gemv_params(const Mxfp4Experts& e, const int32_t* slot, const int32_t* begin,
                                   const int32_t* num, const int32_t* pair_row, const void* x, int64_t ld_x, float* y,
                                   int64_t ld_y, bool swiglu, const MoeWeights& w) {
  auto p = expert_params<kernels::MoeGemvParams>(e, slot, begin, num, pair_row, y, ld_y, swiglu, w);
  p.groups = kernels::moe_gemv_groups(e.rows);
  p.x = x;
  p.ld_x = ld_x;
  return p;
}

}  // namespace

void moe_set_kernel(MoeKernel k) { g_kernel.store(int(k)); }
MoeKernel moe_kernel() { return current_kernel(); }

size_t moe_workspace_bytes(const MoeWeights& w, int M) { return size_t(plan(w, M).total); }

MoeWorkspace moe_workspace(const MoeWeights& w, int M, void* ws) {
  Plan p = plan(w, M);
  auto* b = static_cast<uint8_t*>(ws);
  MoeWorkspace v;
  v.logits = reinterpret_cast<float*>(b + p.logits);
  v.ids = reinterpret_cast<int32_t*>(b + p.ids);
  v.weights = reinterpret_cast<float*>(b + p.weights);
  v.pos_of = reinterpret_cast<int32_t*>(b + p.pos_of);
  v.h = reinterpret_cast<float*>(b + p.h);
  v.ld_h = p.imax;
  v.y = reinterpret_cast<float*>(b + p.y);
  return v;
}

void moe_forward(const MoeWeights& w, const float* x, int64_t ld_x, int M, float* out, int64_t ld_out, void* ws,
                 size_t ws_bytes, cudaStream_t stream, MoeStageHook* hook) {
  const int H = w.hidden(), I = w.inter();
  M3_CHECK(M > 0 && x && out && ld_x >= H && ld_x % 4 == 0 && ld_out >= H, "moe_forward: bad activations (M {}, ld {} / {}, H {})",
           M, ld_x, ld_out, H);
  M3_CHECK(w.E > 0 && w.K > 0 && w.K <= w.E, "moe_forward: {} experts, top {}", w.E, w.K);
  check_experts(w.w13, 2 * I, H, "w13");
  check_experts(w.w2, H, I, "w2");
  M3_CHECK(w.w13.slots == w.E + (w.shared_in_slot ? 1 : 0) && w.w2.slots == w.w13.slots,
           "moe_forward: {} expert slots for {} experts (shared in slot: {})", w.w13.slots, w.E, w.shared_in_slot);
  const bool sep = !w.shared_w13.empty();
  M3_CHECK(!(sep && w.shared_in_slot), "moe_forward: shared expert both in slot and separate");
  if (sep) {
    check_experts(w.shared_w13, 2 * w.shared_w2.cols, H, "shared w13");
    check_experts(w.shared_w2, H, w.shared_w2.cols, "shared w2");
  }
  M3_CHECK(w.router.rows == w.E && w.router.cols == H && w.router_bias, "moe_forward: router [{} x {}] for {} experts",
           w.router.rows, w.router.cols, w.E);
  const Plan pl = plan(w, M);
  M3_CHECK(ws && ws_bytes >= pl.total, "moe_forward: workspace of {} bytes < {}", ws_bytes, pl.total);
  auto* b = static_cast<uint8_t*>(ws);
  auto I32 = [&](uint64_t off) { return reinterpret_cast<int32_t*>(b + off); };
  auto F32 = [&](uint64_t off) { return reinterpret_cast<float*>(b + off); };
  const int MK = M * w.K;

  auto stage = [&](const char* name) { return !hook || hook->before(stream, name); };

  // 1. router logits (fp32), 2. top-k, 3. grouping
  if (!stage("router")) return;
  linear_dense(w.router, ActIn{x, DType::F32, ld_x}, M, F32(pl.logits), w.E, stream, nullptr, LinearPath::Gemv);
  if (!stage("route")) return;
  MoeGroupBuffers gb{I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row),
                     I32(pl.pos_of),     I32(pl.sh_slot),     I32(pl.sh_begin), I32(pl.sh_num)};
  moe_route(F32(pl.logits), w.E, w.router_bias, w.E, w.K, M, w.routed_scale, I32(pl.ids), F32(pl.weights),
            w.shared_in_slot, sep, gb, stream);

  // 4. gate/up + SwiGLU per pair, 5. down per pair
  const int entries = std::min(w.E, MK) + (w.shared_in_slot ? 1 : 0);
  const int ld_h = pl.imax;
  const MoeKernel kern = current_kernel();
  if (kern == MoeKernel::Gemv) {
    if (!stage("gate_up")) return;
    auto up = gemv_params(w.w13, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row), x, ld_x,
                          F32(pl.h), ld_h, true, w);
    launch_moe_gemv(up, entries, M, stream);
    if (sep) {
      auto sup = gemv_params(w.shared_w13, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), I32(pl.pair_row), x,
                             ld_x, F32(pl.h), ld_h, true, w);
      launch_moe_gemv(sup, 1, M, stream);
    }
    if (!stage("down")) return;
    auto down = gemv_params(w.w2, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), nullptr, F32(pl.h), ld_h,
                            F32(pl.y), H, false, w);
    launch_moe_gemv(down, entries, M, stream);
    if (sep) {
      auto sdown = gemv_params(w.shared_w2, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), nullptr, F32(pl.h),
                               ld_h, F32(pl.y), H, false, w);
      launch_moe_gemv(sdown, 1, M, stream);
    }
  } else {
    // deep once the routed entries average 16 pairs or more (the shared expert follows the same
    // choice); a speed choice only: both modes give the same bits
    const bool deep = kern == MoeKernel::Deep || (kern == MoeKernel::Auto && int64_t(MK) >= int64_t(16) * w.E);
    // the activations split once (x = hi + lo, kernels/moe_mma.cuh); the gate/up kernels write
    // their SwiGLU outputs both as fp32 (h) and split (hs) for the down kernels
    auto* XS = reinterpret_cast<uint16_t*>(b + pl.xs);
    auto* HS = reinterpret_cast<uint16_t*>(b + pl.hs);
    M3_CHECK(M < 65536, "moe_forward: {} tokens in one pass (at most 65535)", M);
    if (!stage("split")) return;
    moe_split_kernel<<<dim3(unsigned((pl.ld_xs / 16 + kSplitThreads - 1) / kSplitThreads), unsigned(M)),
                       kSplitThreads, 0, stream>>>(x, ld_x, H, XS, pl.ld_xs);
    M3_LAUNCH_CHECK(stream);
    if (!stage("gate_up")) return;
    auto up = mma_params(w.w13, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row), XS, pl.ld_xs,
                         F32(pl.h), ld_h, HS, pl.ld_hs, true, w);
    launch_moe_mma(up, entries, deep, stream);
    if (sep) {
      auto sup = mma_params(w.shared_w13, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), I32(pl.pair_row), XS,
                            pl.ld_xs, F32(pl.h), ld_h, HS, pl.ld_hs, true, w);
      launch_moe_mma(sup, 1, deep, stream);
    }
    if (!stage("down")) return;
    auto down = mma_params(w.w2, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), nullptr, HS, pl.ld_hs,
                           F32(pl.y), H, nullptr, 0, false, w);
    launch_moe_mma(down, entries, deep, stream);
    if (sep) {
      auto sdown = mma_params(w.shared_w2, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), nullptr, HS, pl.ld_hs,
                              F32(pl.y), H, nullptr, 0, false, w);
      launch_moe_mma(sdown, 1, deep, stream);
    }
  }

  // 6. combine in a fixed order
  if (!stage("combine")) return;
  kernels::MoeCombineParams cp;
  cp.y = F32(pl.y);
  cp.ld_y = H;
  cp.pos_of = I32(pl.pos_of);
  cp.topk_w = F32(pl.weights);
  cp.shared_base = (w.shared_in_slot || sep) ? MK : -1;
  cp.M = M;
  cp.K = w.K;
  cp.H = H;
  cp.out = out;
  cp.ld_out = ld_out;
  M3_CHECK(M < 65536, "moe_forward: {} tokens in one pass (at most 65535)", M);
  moe_combine_kernel<<<dim3(unsigned((H + kCombineThreads - 1) / kCombineThreads), unsigned(M)), kCombineThreads, 0,
                       stream>>>(cp);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
