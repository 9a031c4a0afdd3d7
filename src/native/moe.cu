// The MoE layer as ops (native/moe.h): router GEMV, route, split, the grouped MXFP4 expert
// projections sized for the most entries a batch of M tokens can have (entries past the real
// count exit at once), combine. Expert kernels: tensor cores (kernels/moe_mma.cuh; wide for
// decode, deep for prefill, bitwise the same results), or the CUDA-core GEMV of
// kernels/moe_mxfp4.cuh (moe_set_kernel(MoeKernel::Gemv), or M3_MOE_GEMV=1 in the environment: the
// fallback and the yardstick).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/moe_down_combine.cuh"
#include "kernels/moe_mma.cuh"
#include "kernels/moe_mxfp4.cuh"
#include "native/cuda_check.h"
#include "native/env_switch.h"
#include "native/launch.cuh"
#include "native/moe.h"
#include "native/router.h"

namespace m3::native {

namespace {

// Staged wide kernel: 3 stages per warp (H200, 2026-11-30, tp4 experts: 3 and 4 stages within 3%,
// 6 slower; 10-18% faster than the register pipeline at M = 2-16, equal at M = 1).
constexpr int kWideStages = 3;

uint64_t align256(uint64_t v) { return (v + 255) / 256 * 256; }

struct Layout {  // byte offsets inside the workspace
  uint64_t logits, ids, weights, entry_slot, entry_begin, num, sh_slot, sh_begin, sh_num, pair_row, pos_of, h, y, xs,
      hs, total;
  int pairs, imax;
  int64_t ld_xs, ld_hs;  // uint16 per row of the split activations (kernels/moe_mma.cuh)
};

Layout layout(const MoeWeights& w, int M) {
  Layout p{};
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
  // a row's whole 32-element blocks: 16 bytes each in MXFP4, 32 in MXFP8
  M3_CHECK(e.codes && e.scales && e.rows == rows && e.cols == cols && e.ld >= (cols + 31) / 32 * (e.fp8 ? 32 : 16) &&
               e.ld % 16 == 0 && e.sld >= (cols + 31) / 32 && reinterpret_cast<uintptr_t>(e.codes) % 16 == 0,
           "moe: {} {} experts [{} x {}] (ld {}, sld {}) do not match [{} x {}]", what, e.fp8 ? "MXFP8" : "MXFP4",
           e.rows, e.cols, e.ld, e.sld, rows, cols);
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

// The staged chain needs 4-byte aligned scale rows (kernels/moe_mma.cuh).
bool stageable(const kernels::MoeMmaParams& p) {
  return p.sld % 4 == 0 && p.slot_scales % 4 == 0 && reinterpret_cast<uintptr_t>(p.scales) % 4 == 0;
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

// One projection for the entries of a list on tensor cores: wide (staged when the scale rows
// allow it and a step has more than one token, else the register pipeline) or deep; the same bits
// either way. H200, tp4, 2026-12-02: at one token the register pipeline ran gate/up 18.50 us and
// down 10.10 us against the ring's 19.55 / 10.33; at four tokens the ring was 5-6% ahead.
kernels::MoeMmaParams mma_params(const Mxfp4Experts& e, const int32_t* slot, const int32_t* begin, const int32_t* num,
                                 const int32_t* pair_row, const uint16_t* xs, int64_t ld_xs, float* y, int64_t ld_y,
                                 uint16_t* ys, int64_t ld_ys, bool swiglu, const MoeWeights& w, int entries,
                                 bool deep, int tokens) {
  auto p = expert_params<kernels::MoeMmaParams>(e, slot, begin, num, pair_row, y, ld_y, swiglu, w);
  p.xs = xs;
  p.ld_xs = ld_xs;
  p.ys = ys;
  p.ld_ys = ld_ys;
  p.chains = kernels::moe_mma_chains(p.N, p.K, device_sm_count());
  p.max_entries = entries;
  p.fp8 = e.fp8 ? 1 : 0;
  p.deep = deep ? 1 : 0;
  p.stages = !deep && !e.fp8 && tokens > 1 && stageable(p) ? kWideStages : 0;
  p.workers = deep ? device_sm_count() : 0;  // one resident wave of one CTA per SM
  return p;
}

kernels::MoeGemvParams gemv_params(const Mxfp4Experts& e, const int32_t* slot, const int32_t* begin,
                                   const int32_t* num, const int32_t* pair_row, const void* x, int64_t ld_x, float* y,
                                   int64_t ld_y, bool swiglu, const MoeWeights& w, int entries, int max_tokens) {
  M3_CHECK(!e.fp8, "moe: the CUDA-core expert GEMV (M3_MOE_GEMV=1) reads MXFP4 experts; these are MXFP8");
  auto p = expert_params<kernels::MoeGemvParams>(e, slot, begin, num, pair_row, y, ld_y, swiglu, w);
  p.groups = kernels::moe_gemv_groups(e.rows);
  p.x = x;
  p.ld_x = ld_x;
  p.warp_items = int64_t(entries) * p.groups;
  // tokens per pass: the most any entry can have (each token meets an expert at most once)
  p.mt = max_tokens <= 1 ? 1 : max_tokens <= 4 ? 4 : kernels::kMoeMaxTokens;
  return p;
}

}  // namespace

void moe_set_kernel(MoeKernel k) { g_kernel.store(int(k)); }
MoeKernel moe_kernel() { return current_kernel(); }

size_t moe_workspace_bytes(const MoeWeights& w, int M) { return size_t(layout(w, M).total); }

MoeWorkspace moe_workspace(const MoeWeights& w, int M, void* ws) {
  Layout p = layout(w, M);
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

void add_moe_ops(std::vector<OpCall>& ops, const MoeWeights& w, const float* x, int64_t ld_x, int M, float* out,
                 int64_t ld_out, void* ws, size_t ws_bytes, int layer, int32_t* route_arrivals) {
  const int H = w.hidden(), I = w.inter();
  M3_CHECK(M > 0 && x && out && ld_x >= H && ld_x % 4 == 0 && ld_out >= H,
           "moe_forward: bad activations (M {}, ld {} / {}, H {})", M, ld_x, ld_out, H);
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
  const Layout pl = layout(w, M);
  M3_CHECK(ws && ws_bytes >= pl.total, "moe_forward: workspace of {} bytes < {}", ws_bytes, pl.total);
  auto* b = static_cast<uint8_t*>(ws);
  auto I32 = [&](uint64_t off) { return reinterpret_cast<int32_t*>(b + off); };
  auto F32 = [&](uint64_t off) { return reinterpret_cast<float*>(b + off); };
  const int MK = M * w.K;
  auto add = [&](OpKind kind, const char* name, OpParams p) { ops.push_back(OpCall{kind, "moe", name, layer, p}); };

  // 1. router logits (fp32), 2. top-k + grouping (fused into 1 where it fits)
  const auto rg = make_gemv_params(w.router.data, w.router.dtype, nullptr, w.router.ld, w.router.rows, w.router.cols,
                                   ActIn{x, DType::F32, ld_x}, M, F32(pl.logits), w.E, false, 0, 0);
  MoeGroupBuffers gb{I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row),
                     I32(pl.pos_of),     I32(pl.sh_slot),     I32(pl.sh_begin), I32(pl.sh_num)};
  const auto sp = make_router_select_params(F32(pl.logits), w.E, w.router_bias, w.E, w.K, M, w.routed_scale,
                                            I32(pl.ids), F32(pl.weights));
  const auto gp = make_moe_group_params(I32(pl.ids), M, w.K, w.E, w.shared_in_slot, sep, gb);
  if (M > kernels::kRouteFusedMaxTokens) {
    add(OpKind::Gemv, "router", rg);
    add(OpKind::RouterSelect, "route", sp);
    add(OpKind::MoeGroup, "route", gp);
  } else if (const auto rp = make_moe_route_params(sp, gp);
             route_arrivals && router_gemv_route_enabled() && kernels::router_gemv_route_fits(rg, rp)) {
    add(OpKind::RouterGemvRoute, "router", make_router_gemv_route_params(rg, rp, route_arrivals));
  } else {
    add(OpKind::Gemv, "router", rg);
    add(OpKind::MoeRoute, "route", rp);
  }

  // 3. gate/up + SwiGLU per pair, 4. down per pair
  const int entries = std::min(w.E, MK) + (w.shared_in_slot ? 1 : 0);
  const int ld_h = pl.imax;
  const MoeKernel kern = current_kernel();
  if (kern == MoeKernel::Gemv) {
    add(OpKind::MoeGemv, "gate_up",
        gemv_params(w.w13, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row), x, ld_x, F32(pl.h),
                    ld_h, true, w, entries, M));
    if (sep)
      add(OpKind::MoeGemv, "gate_up",
          gemv_params(w.shared_w13, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), I32(pl.pair_row), x, ld_x,
                      F32(pl.h), ld_h, true, w, 1, M));
    add(OpKind::MoeGemv, "down",
        gemv_params(w.w2, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), nullptr, F32(pl.h), ld_h, F32(pl.y), H,
                    false, w, entries, M));
    if (sep)
      add(OpKind::MoeGemv, "down",
          gemv_params(w.shared_w2, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), nullptr, F32(pl.h), ld_h,
                      F32(pl.y), H, false, w, 1, M));
  } else {
    // deep once the routed entries average 16 pairs or more (the shared expert follows the same
    // choice); a speed choice only: both modes give the same bits
    const bool deep = kern == MoeKernel::Deep || (kern == MoeKernel::Auto && int64_t(MK) >= int64_t(16) * w.E);
    // the activations split once (x = hi + lo, kernels/moe_mma.cuh); the gate/up kernels write
    // their SwiGLU outputs both as fp32 (h) and split (hs) for the down kernels
    auto* XS = reinterpret_cast<uint16_t*>(b + pl.xs);
    auto* HS = reinterpret_cast<uint16_t*>(b + pl.hs);
    add(OpKind::MoeSplit, "split", kernels::MoeSplitParams{x, ld_x, H, M, XS, pl.ld_xs});
    add(OpKind::MoeMma, "gate_up",
        mma_params(w.w13, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), I32(pl.pair_row), XS, pl.ld_xs,
                   F32(pl.h), ld_h, HS, pl.ld_hs, true, w, entries, deep, M));
    if (sep)
      add(OpKind::MoeMma, "gate_up",
          mma_params(w.shared_w13, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), I32(pl.pair_row), XS, pl.ld_xs,
                     F32(pl.h), ld_h, HS, pl.ld_hs, true, w, 1, deep, M));
    add(OpKind::MoeMma, "down",
        mma_params(w.w2, I32(pl.entry_slot), I32(pl.entry_begin), I32(pl.num), nullptr, HS, pl.ld_hs, F32(pl.y), H,
                   nullptr, 0, false, w, entries, deep, M));
    if (sep)
      add(OpKind::MoeMma, "down",
          mma_params(w.shared_w2, I32(pl.sh_slot), I32(pl.sh_begin), I32(pl.sh_num), nullptr, HS, pl.ld_hs, F32(pl.y),
                     H, nullptr, 0, false, w, 1, deep, M));
  }

  // 5. combine in a fixed order
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
  add(OpKind::MoeCombine, "combine", cp);
}

namespace {
EnvSwitch g_combine_last("M3_COMBINE_LAST", false);  // measured slower (H100 2026-12-07, docs/perf.md)
}
bool moe_down_combine_enabled() { return g_combine_last.on(); }
void set_moe_down_combine(int on) { g_combine_last.set(on); }

bool fuse_down_combine(std::vector<OpCall>& ops, int32_t* arrivals, int64_t capacity) {
  const size_t n = ops.size();
  if (!arrivals || !moe_down_combine_enabled() || n < 3 || ops[n - 1].kind != OpKind::MoeCombine ||
      ops[n - 2].kind != OpKind::MoeMma || std::string_view(ops[n - 2].name) != "down" ||
      std::string_view(ops[n - 3].name) == "down")
    return false;
  const auto& d = std::get<kernels::MoeMmaParams>(ops[n - 2].params);
  const auto& c = std::get<kernels::MoeCombineParams>(ops[n - 1].params);
  if (!kernels::moe_down_combine_fits(d, c) || kernels::moe_row_tiles(d) > capacity) return false;
  OpCall f{OpKind::MoeDownCombine, ops[n - 2].stage, "down", ops[n - 2].layer,
           kernels::MoeDownCombineParams{d, c, arrivals}};
  ops.pop_back();
  ops.back() = f;
  return true;
}

void moe_forward(const MoeWeights& w, const float* x, int64_t ld_x, int M, float* out, int64_t ld_out, void* ws,
                 size_t ws_bytes, cudaStream_t stream) {
  std::vector<OpCall> ops;
  add_moe_ops(ops, w, x, ld_x, M, out, ld_out, ws, ws_bytes);
  for (const OpCall& op : ops) launch(op, stream);
}

void launch(const kernels::MoeSplitParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::MoeSplitOp>(p, kernels::moe_split_shape(p), stream, "moe_split", opt);
}

namespace {
// The one-token register walk over whole items as an experiment (kernels/moe_mma.cuh
// chain_sum_whole): M3_MOE_WALK=2x1, two register groups of one block of kMoeWideRT row tiles
// (lean3's walk), or 3x1a2, three groups with the activations two groups at a time; unset or 0:
// chain_sum for every item, as the mono kernel. Both measured slower than 0 (H100 2026-12-07,
// docs/perf.md; an L2 prefetch variant too, since removed); kept for the ncu comparison of 0 and
// 3x1a2. The same bits either way. Read once.
int moe_walk() {
  static const int w = env_choice("M3_MOE_WALK", {"0", "2x1", "3x1a2"}, "0");
  return w;
}
}  // namespace

void launch(const kernels::MoeMmaParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  const kernels::WorkShape sh = kernels::moe_mma_shape(p);
  if (p.fp8 && !p.deep) {
    M3_CHECK(p.stages == 0, "moe_mma: MXFP8 experts run the register or deep walk ({} stages)", p.stages);
    return launch_op<kernels::MoeWideFp8Op>(p, sh, stream, "moe_mma", opt);
  }
  if (p.deep) {
    // the deep walk's ring is filled by 16-byte cp.async of code rows and activation groups
    auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    M3_CHECK(a16(p.codes) && p.ld % 16 == 0 && p.slot_codes % 16 == 0 && a16(p.xs) && p.ld_xs % 8 == 0,
             "moe_mma deep: code rows ({} B, slots of {} B) and split activations (ld {}) must be 16-byte aligned",
             p.ld, p.slot_codes, p.ld_xs);
    if (p.fp8) launch_op<kernels::MoeDeepFp8Op>(p, sh, stream, "moe_mma", opt);
    else launch_op<kernels::MoeDeepOp>(p, sh, stream, "moe_mma", opt);
  }
  else if (p.stages == kWideStages) launch_op<kernels::MoeWideOp<kWideStages>>(p, sh, stream, "moe_mma", opt);
  else if (p.stages == 0) {
    switch (moe_walk()) {
      case 1: return launch_op<kernels::MoeWideOp<0, 2, 1>>(p, sh, stream, "moe_mma", opt);
      case 2: return launch_op<kernels::MoeWideOp<0, 3, 1, 2>>(p, sh, stream, "moe_mma", opt);
      default: return launch_op<kernels::MoeWideOp<0>>(p, sh, stream, "moe_mma", opt);
    }
  } else M3_FAIL("moe_mma: {} stages (0 or {})", p.stages, kWideStages);
}

void launch(const kernels::MoeGemvParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  const kernels::WorkShape sh = kernels::moe_gemv_shape(p);
  switch (p.mt) {
    case 1: return launch_op<kernels::MoeGemvOp<1>>(p, sh, stream, "moe_gemv", opt);
    case 4: return launch_op<kernels::MoeGemvOp<4>>(p, sh, stream, "moe_gemv", opt);
    case kernels::kMoeMaxTokens: return launch_op<kernels::MoeGemvOp<kernels::kMoeMaxTokens>>(p, sh, stream, "moe_gemv", opt);
    default: M3_FAIL("moe_gemv: {} tokens per pass (1, 4 or {})", p.mt, kernels::kMoeMaxTokens);
  }
}

void launch(const kernels::MoeCombineParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::MoeCombineOp>(p, kernels::moe_combine_shape(p), stream, "moe_combine", opt);
}

void launch(const kernels::MoeDownCombineParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  const kernels::WorkShape sh = kernels::moe_down_combine_shape(p);
  if (p.down.stages == kWideStages)
    return launch_op<kernels::MoeDownCombineOp<kWideStages>>(p, sh, stream, "moe_down_combine", opt);
  M3_CHECK(p.down.stages == 0, "moe_down_combine: {} stages (0 or {})", p.down.stages, kWideStages);
  launch_op<kernels::MoeDownCombineOp<0>>(p, sh, stream, "moe_down_combine", opt);
}

}  // namespace m3::native
