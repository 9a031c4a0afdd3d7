// Params and work shapes of the MoE device functions: the activation split and the tensor-core
// expert projections (kernels/moe_mma.cuh), the CUDA-core expert GEMV and the fixed-order combine
// (kernels/moe_mxfp4.cuh). Routing is kernels/router_params.h.
// Entry lists (router.cuh, moe_group_work): entry a = expert slot entry_slot[a] with pairs
// [entry_begin[a], entry_begin[a+1]); pair p reads activation row pair_row[p] (p when null) and
// writes output row p. Entries at or past *num_entries do nothing, so launches are sized for the
// most entries a batch can have.
#pragma once
#include <cstdint>

#include "kernels/mma_params.h"
#include "kernels/work.h"

namespace m3::kernels {

// ---- tensor cores (moe_mma.cuh) ----
constexpr int kMoeKBlock = 128;   // K elements per block (4 lanes x one 32-element MX block)
constexpr int kMoeMaxChains = 16; // warps per item in the wide mode

struct MoeMmaParams {
  const uint8_t* codes = nullptr;   // [slots][N][ld]
  const uint8_t* scales = nullptr;  // [slots][N][sld]
  int64_t ld = 0, sld = 0;          // bytes per row
  int64_t slot_codes = 0, slot_scales = 0;  // bytes per slot
  int N = 0, K = 0;
  int chains = 1;                   // P (moe_mma_chains)
  const int32_t* entry_slot = nullptr;   // [entries]
  const int32_t* entry_begin = nullptr;  // [entries + 1]
  const int32_t* num_entries = nullptr;  // device scalar
  const int32_t* pair_row = nullptr;     // [pairs] or null (row = pair)
  const uint16_t* xs = nullptr;          // split activations [rows][ld_xs]
  int64_t ld_xs = 0;                     // uint16 per row
  float* y = nullptr;                    // [pairs][ld_y]
  int64_t ld_y = 0;
  uint16_t* ys = nullptr;                // optional: the outputs split too [pairs][ld_ys] (columns < N/2
  int64_t ld_ys = 0;                     // or N written; the rest left unset)
  int swiglu = 0;                        // 1: gate/up rows -> y[p, n/2]
  float alpha = 1.702f, limit = 7.0f;
  // Launch layout (native::make_moe_mma_params): the most entries of the batch (items are sized
  // for them), the walk (wide or deep), the wide walk's weight path (stages > 0: the staged ring
  // of that many stages per warp; 0: registers), the deep walk's persistent workers (CTAs).
  int max_entries = 0;
  int deep = 0;
  int stages = 0;
  int workers = 0;
  // MXFP8 experts (moe_mma.cuh, MoeWideFp8Op / MoeDeepFp8Op): E4M3 codes, one byte an element (ld >=
  // round_up(K, 32)), the same E8M0 scales (4 .. 134 only); the register or deep walk (stages 0)
  int fp8 = 0;
};

// Tilings (any gives the same bits, moe_mma.cuh): wide 32 rows x 8 pairs per item and P warps;
// deep 32 rows x 32 pairs per warp, a CTA of kMoeDeepRowGroups x kMoeDeepTokGroups warps.
constexpr int kMoeWideRT = 2, kMoeWideNT = 1, kMoeDeepRT = 2, kMoeDeepNT = 4;
constexpr int kMoeDeepRowGroups = 4, kMoeDeepTokGroups = 2;
constexpr int kMoeDeepWarps = kMoeDeepRowGroups * kMoeDeepTokGroups;
constexpr int kMoeDeepRows = 16 * kMoeDeepRT * kMoeDeepRowGroups;   // 128 weight rows per CTA tile
constexpr int kMoeDeepTokens = 8 * kMoeDeepNT * kMoeDeepTokGroups;  // 64 pairs per CTA tile
constexpr int kMoeDeepStages = 4;                                    // ring stages (blocks in flight)

// P: enough warps to stream the experts of a batch-1 step (4 entries assumed: top-k of the smallest
// models we run is >= 4) at about kMoeWideWarpsPerSm warps per SM over the ceil(N/16) row tiles; at
// most kMoeMaxChains, at most one chain per block. Depends on N, K, SMs only. 21 (H200 2026-12-04,
// docs/perf.md): the tp4 gate/up at P = 8 instead of 16's P = 6 ran 16.07 us against 17.50 at one
// token (native b=1 -70 us a step, b=4 -110; mono b=1 -33), 28 (P = 10) ran 21.6 us; down stays P = 2.
constexpr int kMoeWideWarpsPerSm = 21;
M3_HOST_DEVICE inline int moe_mma_chains(int N, int K, int sms) {
  const int tiles = (N + 15) / 16, blocks = (K + kMoeKBlock - 1) / kMoeKBlock;
  int p = (sms * kMoeWideWarpsPerSm + 4 * tiles - 1) / (4 * tiles);
  p = p < kMoeMaxChains ? p : kMoeMaxChains;
  p = p < blocks ? p : blocks;
  return p < 1 ? 1 : p;
}

// The staged wide walk's ring, per warp and stage: codes [RT][2][32 lanes][16 B], then the 4 scale
// bytes of each of the tile's 16 RT rows.
M3_HOST_DEVICE constexpr int moe_staged_code_bytes(int rt) { return rt * 2 * 32 * 16; }
M3_HOST_DEVICE constexpr int moe_staged_stage_bytes(int rt) { return moe_staged_code_bytes(rt) + rt * 16 * 4; }
M3_HOST_DEVICE constexpr int moe_wide_ring_bytes(int rt, int stages) { return stages * moe_staged_stage_bytes(rt); }
// Wide item shared memory: the chain partials (16-byte aligned), then (stages > 0) the warps' rings.
M3_HOST_DEVICE constexpr int moe_wide_partials_bytes(int chains) {
  return (mma_wide_smem_floats(kMoeWideRT, kMoeWideNT, chains) * 4 + 15) / 16 * 16;
}
M3_HOST_DEVICE constexpr int moe_wide_smem_bytes(int chains, int stages) {
  return moe_wide_partials_bytes(chains) + chains * (stages > 0 ? moe_wide_ring_bytes(kMoeWideRT, stages) : 0);
}
// Staged wide items (moe_mma.cuh, moe_stage_tile; the mono kernel): the 16 kMoeWideRT rows of one
// item's tile in shared memory: codes at a padded stride (ld rounded up to 128 bytes, plus 64: the
// 8 lanes of a quarter warp, rows g and g + 1 at 16-byte offsets 16 t, hit 8 distinct 16-byte bank
// groups), then the rows' scale bytes as they are in global memory (contiguous, [rows][sld]),
// rounded up to 16 bytes. The tile follows the chain partials at a 128-byte boundary.
M3_HOST_DEVICE constexpr int64_t moe_staged_code_stride(int64_t ld) { return (ld + 127) / 128 * 128 + 64; }
M3_HOST_DEVICE constexpr int64_t moe_staged_tile_bytes(int64_t ld, int64_t sld) {
  return 16 * kMoeWideRT * moe_staged_code_stride(ld) + (16 * kMoeWideRT * sld + 15) / 16 * 16;
}
M3_HOST_DEVICE constexpr int moe_staged_tile_offset(int chains) {
  return (moe_wide_partials_bytes(chains) + 127) / 128 * 128;
}
// Whether a wide op's tiles can be staged: whole row tiles (N a multiple of 16 kMoeWideRT, so no
// copy reaches past a slot's rows) and 16-byte aligned code rows, slots and scale blocks.
inline bool moe_can_stage(const MoeMmaParams& p) {
  auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return !p.deep && !p.fp8 && p.N % (16 * kMoeWideRT) == 0 && p.ld % 16 == 0 && p.slot_codes % 16 == 0 &&
         p.slot_scales % 16 == 0 && a16(p.codes) && a16(p.scales);
}

M3_HOST_DEVICE inline int moe_row_tiles(const MoeMmaParams& p) { return (p.N + 16 * kMoeWideRT - 1) / (16 * kMoeWideRT); }

// The deep walk's ring (moe_mma.cuh, moe_mma_deep_work), per stage: one K block of the CTA tile's
// activations ([kMoeDeepTokens pairs][128 elements as split groups, 512 B], 16-byte chunks
// swizzled), then of its weight codes ([kMoeDeepRows rows][64 B]). After the ring: the warps'
// running totals (mma_deep_smem_floats_per_warp floats each).
// MXFP8 experts (fp8): the codes of a block are [kMoeDeepRows rows][128 B], the rest the same.
constexpr int kMoeDeepActBytes = kMoeDeepTokens * kMoeKBlock * 4;
M3_HOST_DEVICE constexpr int moe_deep_code_bytes(bool fp8) { return kMoeDeepRows * kMoeKBlock / (fp8 ? 1 : 2); }
M3_HOST_DEVICE constexpr int moe_deep_stage_bytes(bool fp8) { return kMoeDeepActBytes + moe_deep_code_bytes(fp8); }
M3_HOST_DEVICE constexpr int moe_deep_smem_bytes(bool fp8) {
  return kMoeDeepStages * moe_deep_stage_bytes(fp8) +
         kMoeDeepWarps * mma_deep_smem_floats_per_warp(kMoeDeepRT, kMoeDeepNT) * 4;
}
static_assert(moe_deep_smem_bytes(true) <= 227 * 1024, "the MXFP8 deep ring exceeds an SM's shared memory");
M3_HOST_DEVICE inline int moe_deep_row_groups(const MoeMmaParams& p) { return (p.N + kMoeDeepRows - 1) / kMoeDeepRows; }

// Wide: item = (row tile, entry), row tile fastest, entries in reverse order (the last real entry,
// the shared expert with every token and so the most token tiles, starts first); 32 P threads.
// Deep: item = one of `workers` persistent CTAs walking the list of CTA tiles, kMoeDeepWarps warps.
M3_HOST_DEVICE inline WorkShape moe_mma_shape(const MoeMmaParams& p) {
  if (p.deep) return {p.workers, 32 * kMoeDeepWarps, moe_deep_smem_bytes(p.fp8 != 0)};
  return {int64_t(moe_row_tiles(p)) * p.max_entries, 32 * p.chains, moe_wide_smem_bytes(p.chains, p.stages)};
}

// The split of fp32 activations into bf16 hi + lo groups (moe_mma.cuh's layout).
struct MoeSplitParams {
  const float* x = nullptr;  // [M][ld_x]
  int64_t ld_x = 0;
  int K = 0, M = 0;
  uint16_t* xs = nullptr;    // [M][ld_xs]
  int64_t ld_xs = 0;         // uint16 per row (groups up to ld_xs / 16)
  NormIn nin;                // the norm's halves (fused_norm_params.h): x is z, the split is of z * inv
};
constexpr int kMoeSplitThreads = 256;
// Item = (slice of 256 groups, row), slice fastest; one group per thread. smem: the row's inv
// (nin.ss).
M3_HOST_DEVICE inline WorkShape moe_split_shape(const MoeSplitParams& p) {
  return {ceil_div(p.ld_xs / 16, kMoeSplitThreads) * p.M, kMoeSplitThreads, p.nin.ss ? 16 : 0};
}

// ---- CUDA cores (moe_mxfp4.cuh) ----
constexpr int kMoeRowsPerWarp = 2;  // a gate/up pair
constexpr int kMoeInflight = 3;     // chunks in flight per row and lane
constexpr int kMoeMaxTokens = 8;    // tokens per pass over the rows
constexpr int kMoeGemvWarps = 4;    // warp work items per CTA-sized item

struct MoeGemvParams {
  const uint8_t* codes = nullptr;   // [slots][N][ld]
  const uint8_t* scales = nullptr;  // [slots][N][sld]
  int64_t ld = 0, sld = 0;          // bytes per row
  int64_t slot_codes = 0, slot_scales = 0;  // bytes per slot
  int N = 0, K = 0;                 // rows and columns of one slot
  int groups = 0;                   // warp work items per entry: ceil(N / 2)
  const int32_t* entry_slot = nullptr;   // [entries]
  const int32_t* entry_begin = nullptr;  // [entries + 1]
  const int32_t* num_entries = nullptr;  // device scalar
  const int32_t* pair_row = nullptr;     // [pairs] or null (row = pair)
  const void* x = nullptr;               // activations, fp32
  int64_t ld_x = 0;
  float* y = nullptr;                    // [pairs][ld_y]
  int64_t ld_y = 0;
  int swiglu = 0;                        // 1: gate/up rows -> y[p, n/2]
  float alpha = 1.702f, limit = 7.0f;
  // Launch layout (native): warp items (max entries x groups), tokens per pass (1, 4 or 8).
  int64_t warp_items = 0;
  int mt = 1;
  NormIn nin;  // the norm's inv (fused_norm_params.h; nin.inv only): outputs times their row's inv
};

inline int moe_gemv_groups(int N) { return (N + kMoeRowsPerWarp - 1) / kMoeRowsPerWarp; }
// Item = kMoeGemvWarps warp items (warp i of the group: warp item kMoeGemvWarps * w + i).
M3_HOST_DEVICE inline WorkShape moe_gemv_shape(const MoeGemvParams& p) {
  return {ceil_div(p.warp_items, kMoeGemvWarps), 32 * kMoeGemvWarps, 0};
}

struct MoeCombineParams {
  const float* y = nullptr;       // [pairs][ld_y] expert outputs
  int64_t ld_y = 0;
  const int32_t* pos_of = nullptr;  // [M*K] pair of (token, choice)
  const float* topk_w = nullptr;    // [M*K] combine weights (routed_scale applied)
  int shared_base = -1;             // pair of token 0's shared-expert output, -1: none
  int M = 0, K = 0, H = 0;
  float* out = nullptr;             // [M][ld_out]
  int64_t ld_out = 0;
  NormOut nout;  // fused RMS norm (fused_norm_params.h): set, out is not written
};
constexpr int kMoeCombineThreads = 256;
// Item = (slice of 256 channels, token), slice fastest; one channel per thread.
M3_HOST_DEVICE inline WorkShape moe_combine_shape(const MoeCombineParams& p) {
  return {ceil_div(p.H, kMoeCombineThreads) * p.M, kMoeCombineThreads, 0};
}

// The experts' down projection whose last item of each row tile combines that tile's rows
// (kernels/moe_down_combine.cuh; decode): the wide down items as MoeWideOp runs them (one row tile
// of 16 kMoeWideRT rows, one entry an item), each adding 1 to its row tile's arrival counter when its
// outputs are written (or at once for an entry this step does not have); the item that brings a
// tile's counter to max_entries resets it and runs the combine of the tile's rows for every token
// (moe_combine_element, one warp a token). The same sums, one op less on the chain.
struct MoeDownCombineParams {
  MoeMmaParams down;        // down.y == combine.y
  MoeCombineParams combine;
  int32_t* arrivals = nullptr;  // [moe_row_tiles(down)], 0 between launches
};
constexpr int kMoeDownCombineMaxTokens = 8;
// Where it applies: the wide walk over MXFP4 experts (registers or the staged ring), no SwiGLU, the
// combine reading exactly the down outputs, up to kMoeDownCombineMaxTokens tokens.
M3_HOST_DEVICE inline bool moe_down_combine_fits(const MoeMmaParams& d, const MoeCombineParams& c) {
  return !d.deep && !d.fp8 && !d.swiglu && d.ys == nullptr && c.y == d.y && c.ld_y == d.ld_y && c.H == d.N &&
         c.M >= 1 && c.M <= kMoeDownCombineMaxTokens && (c.nout.res == nullptr || c.H % 16 == 0);
}
M3_HOST_DEVICE inline WorkShape moe_down_combine_shape(const MoeDownCombineParams& p) { return moe_mma_shape(p.down); }

}  // namespace m3::kernels
