// MoE routing on the device (m3-model.md, "FFN"), after the router logits r = Wr y (fp32):
//   select (one warp per token): s_e = sigmoid(r_e), choice_e = s_e + bias_e (both in double, as
//     the CPU reference); top-k by choice, ties to the lower expert id, best first;
//     w_k = s_k / sum_chosen s * routed_scale.
//   group (one block for the whole batch, its warps splitting the pairs when E is small enough):
//     pairs i = t*K + k sorted by expert, then token (stable),
//     as a list of active entries (experts with at least one pair, ascending, then the shared
//     expert's entry when it is slot E of the expert tensors) — the input of moe_mxfp4.cuh.
// Layouts: logits [M][ld], bias [E] fp32; ids [M*K] int32, weights [M*K] fp32;
//   entry_slot [E+1], entry_begin [E+2], num_entries [1];
//   pair_row [M*K + M]: token of each pair (shared-expert pairs M*K + t read token t);
//   pos_of [M*K]: the pair index of (t, k);
//   shared expert in its own tensors: sh_slot [1] = 0, sh_begin [2] = {M*K, M*K + M}, sh_num [1] = 1.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/router_params.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {



// Work item = token; called by one full warp (lane 0..31).
// ids_s (optional): the ids are also written there (the fused route keeps them in shared memory).
// Latency, not work, is what this costs at decode (one warp per token): every load is issued
// first, the sigmoids of a lane's experts are computed without a branch around them (independent
// chains the scheduler can interleave; lanes past E compute a dummy and drop it), and lane k
// keeps choice k, so the K weights are divided in parallel (no runtime-indexed arrays).
__device__ __forceinline__ void router_select_work(const RouterSelectParams& p, int t, int lane,
                                                   int32_t* ids_s = nullptr) {
  constexpr int kPer = kRouterMaxExperts / 32;
  static_assert(kRouterMaxTopK <= 32, "lane k holds choice k");
  const int64_t row = int64_t(t) * p.ld;
  float lg[kPer], bs[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    lg[i] = e < p.E ? p.logits[row + e] : 0.f;
    bs[i] = e < p.E ? p.bias[e] : 0.f;
  }
  double s[kPer], ch[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const double si = 1.0 / (1.0 + exp(-double(lg[i])));
    const bool in = lane + 32 * i < p.E;
    s[i] = in ? si : 0.0;
    ch[i] = in ? si + double(bs[i]) : -INFINITY;
  }
  double my_s = 0, sum = 0;
  int my_e = 0;
  for (int k = 0; k < p.K; ++k) {
    // lane-local best (lowest id on ties: i ascending = e ascending)
    double best = -INFINITY;
    int be = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e < p.E && (ch[i] > best || (ch[i] == best && e < be))) {
        best = ch[i];
        be = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ob > best || (ob == best && oe < be)) {
        best = ob;
        be = oe;
      }
    }
    // the owner retires the winner and broadcasts its sigmoid
    double sw = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) {
        sw = s[i];
        ch[i] = -INFINITY;
      }
    sw = __shfl_sync(0xffffffffu, sw, be & 31);
    if (lane == k) {
      my_s = sw;
      my_e = be;
    }
    sum += sw;
  }
  if (lane < p.K) {
    p.ids[t * p.K + lane] = my_e;
    if (ids_s) ids_s[t * p.K + lane] = my_e;
    p.weights[t * p.K + lane] = float(my_s / sum * double(p.routed_scale));
  }
}

// The lists' end, by one thread, after a routed entries over o pairs: the shared expert's entry
// (slot E over rows MK .. MK + M) where it is a slot, the terminator, the count, and the separate
// shared expert's one-entry list.
__device__ __forceinline__ void moe_group_finish(const MoeGroupParams& p, int a, int o) {
  const int MK = p.M * p.K;
  if (p.shared_slot) {
    p.entry_slot[a] = p.E;
    p.entry_begin[a] = MK;
    ++a;
    o = MK + p.M;
  }
  p.entry_begin[a] = o;
  *p.num_entries = a;
  if (p.shared_separate) {
    p.sh_slot[0] = 0;
    p.sh_begin[0] = MK;
    p.sh_begin[1] = MK + p.M;
    *p.sh_num = 1;
  }
}

// From the per-expert counts cnt[0..E): off[e] = the first pair of expert e, the entry list and the
// shared expert's entries (warp 0 of the group: 32 experts per scan step). Synchronizes the group.
__device__ __forceinline__ void moe_group_entries(const MoeGroupParams& p, Group g, const int32_t* cnt, int32_t* off) {
  const int MK = p.M * p.K;
  if (g.tid < 32) {
    const int lane = g.tid;
    int a = 0, o = 0;  // entries and pairs before this step's 32 experts
    for (int e0 = 0; e0 < p.E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < p.E ? cnt[e] : 0, f = c > 0 ? 1 : 0;
      int sc = c, sf = f;  // inclusive scans over the lanes
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int yc = __shfl_up_sync(0xffffffffu, sc, d), yf = __shfl_up_sync(0xffffffffu, sf, d);
        if (lane >= d) {
          sc += yc;
          sf += yf;
        }
      }
      if (e < p.E) off[e] = o + sc - c;
      if (f) {
        p.entry_slot[a + sf - 1] = e;
        p.entry_begin[a + sf - 1] = o + sc - c;
      }
      o += __shfl_sync(0xffffffffu, sc, 31);
      a += __shfl_sync(0xffffffffu, sf, 31);
    }
    if (lane == 0) {
      off[p.E] = o;
      moe_group_finish(p, a, o);
    }
  }
  g.sync();
}

// One group does the whole batch (nthreads >= 32, a multiple of 32); smem: 2 * (E + 1) ints.
// Thread e counts and then places the pairs of expert e, scanning the ids in order (stable);
// warp 0 turns the counts into offsets and the entry list (32 experts per scan step). O(M*K) per
// thread: cheap for decode. Ids outside [0, E) are left out.
// ids: p.ids, or the same values where the caller has them (the fused route: shared memory).
__device__ __forceinline__ void moe_group_work(const MoeGroupParams& p, Group g, int32_t* smem,
                                               const int32_t* ids = nullptr) {
  if (!ids) ids = p.ids;
  const int tid = g.tid, nthreads = g.nthreads;
  int32_t* cnt = smem;           // [E]
  int32_t* off = smem + p.E + 1; // [E+1]
  const int MK = p.M * p.K;
  for (int e = tid; e < p.E; e += nthreads) {
    int c = 0;
    for (int i = 0; i < MK; ++i) c += ids[i] == e;
    cnt[e] = c;
  }
  g.sync();
  moe_group_entries(p, g, cnt, off);
  for (int e = tid; e < p.E; e += nthreads) {
    int pos = off[e];
    for (int i = 0; i < MK; ++i)
      if (ids[i] == e) {
        p.pair_row[pos] = i / p.K;
        p.pos_of[i] = pos;
        ++pos;
      }
  }
  for (int t = tid; t < p.M; t += nthreads) p.pair_row[MK + t] = t;
}

// The same lists for at most 32 pairs (decode: M K <= 32), by warp 0 without the per-expert scan:
// lane i holds pair i's expert; its position is the number of pairs that sort before it (a lower
// expert, or the same expert and a lower index: the stable order), it opens an entry when no
// lower index has its expert, and that entry's index is the number of such openers with a lower
// expert. ids: p.ids or the same values where the caller has them. Ids outside [0, E) are left out.
__device__ __forceinline__ void moe_group_small_work(const MoeGroupParams& p, Group g, const int32_t* ids) {
  const int MK = p.M * p.K;
  if (g.tid < 32) {
    const int lane = g.tid;
    const int e = lane < MK ? ids[lane] : -1;
    const bool ok = e >= 0 && e < p.E;
    const unsigned valid = __ballot_sync(0xffffffffu, ok);
    int pos = 0, before = 0, entry = 0;  // pairs sorting before mine; lower pairs with my expert; entries below mine
    for (int j = 0; j < MK; ++j) {
      const int ej = __shfl_sync(0xffffffffu, e, j);
      const bool vj = (valid >> j) & 1u;
      pos += vj && (ej < e || (ej == e && j < lane));
      before += vj && ej == e && j < lane;
    }
    const bool opens = ok && before == 0;
    const unsigned openers = __ballot_sync(0xffffffffu, opens);
    for (int j = 0; j < MK; ++j) {
      const int ej = __shfl_sync(0xffffffffu, e, j);
      entry += ((openers >> j) & 1u) && ej < e;
    }
    if (ok) {
      p.pair_row[pos] = lane / p.K;
      p.pos_of[lane] = pos;
    }
    if (opens) {
      p.entry_slot[entry] = e;
      p.entry_begin[entry] = pos;
    }
    if (lane == 0) moe_group_finish(p, __popc(openers), __popc(valid));
  }
  for (int t = g.tid; t < p.M; t += g.nthreads) p.pair_row[MK + t] = t;
}

// The same lists (the same stable order) with the pairs split over the group's W warps: warp w
// owns the contiguous run of pairs [w S, (w + 1) S) (S = ceil(M K / W)); hist[w][e] counts its
// pairs of expert e (shared-memory atomics: counts do not depend on their order), the counts
// become the per-expert offsets (moe_group_entries), then hist[w][e] = off[e] + the pairs of
// expert e in the runs before w; warp w places its run 32 pairs at a time, in order: a lane's rank
// among the lanes with its expert (__match_any_sync) below it. smem: moe_group_op_smem_bytes(E).
__device__ __forceinline__ void moe_group_split_work(const MoeGroupParams& p, Group g, int32_t* smem) {
  const int tid = g.tid, nthreads = g.nthreads, lane = g.lane(), w = g.warp(), W = g.num_warps();
  const int E = p.E, MK = p.M * p.K;
  int32_t* cnt = smem;               // [E]
  int32_t* off = smem + E + 1;       // [E+1]
  int32_t* hist = smem + 2 * (E + 1);  // [W][E]
  const int S = (MK + W - 1) / W, lo = min(MK, w * S), hi = min(MK, lo + S);
  for (int i = tid; i < W * E; i += nthreads) hist[i] = 0;
  g.sync();
  for (int i = lo + lane; i < hi; i += 32) {
    const int e = p.ids[i];
    if (e >= 0 && e < E) atomicAdd(&hist[w * E + e], 1);
  }
  g.sync();
  for (int e = tid; e < E; e += nthreads) {
    int c = 0;
    for (int v = 0; v < W; ++v) c += hist[v * E + e];
    cnt[e] = c;
  }
  g.sync();
  moe_group_entries(p, g, cnt, off);
  for (int e = tid; e < E; e += nthreads) {
    int run = off[e];
    for (int v = 0; v < W; ++v) {
      const int h = hist[v * E + e];
      hist[v * E + e] = run;
      run += h;
    }
  }
  g.sync();
  for (int base = lo; base < hi; base += 32) {
    const int i = base + lane;
    const int e = i < hi ? p.ids[i] : -1;
    const bool ok = e >= 0 && e < E;
    const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1);
    if (ok) {
      const int pos = hist[w * E + e] + __popc(same & ((1u << lane) - 1u));
      p.pair_row[pos] = i / p.K;
      p.pos_of[i] = pos;
    }
    __syncwarp();
    if (ok && lane == __ffs(same) - 1) hist[w * E + e] += __popc(same);
    __syncwarp();
  }
  for (int t = tid; t < p.M; t += nthreads) p.pair_row[MK + t] = t;
}

// ---- the ops (router_params.h shapes) ----
struct RouterSelectOp : OpBounds<32 * kSelectWarps> {
  using Params = RouterSelectParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int t = int(w) * kSelectWarps + g.warp();
    if (t < p.M) router_select_work(p, t, g.lane());
  }
};
struct MoeGroupOp : OpBounds<kGroupOpThreads> {
  using Params = MoeGroupParams;
  __device__ static void run(const Params& p, int64_t, Group g, uint8_t* smem) {
    if (p.E <= kGroupSplitMaxE) moe_group_split_work(p, g, reinterpret_cast<int32_t*>(smem));
    else moe_group_work(p, g, reinterpret_cast<int32_t*>(smem));
  }
};
// The group's warps select the tokens (warp w: tokens w, w + nwarps, ...), then group them. The
// selections reach the grouping through shared memory (after the grouping's own 2 (E + 1) ints;
// group.ids = select.ids in global memory gets the same values for the consumers).
struct MoeRouteOp : OpBounds<kGroupThreads> {
  using Params = MoeRouteParams;
  __device__ static void run(const Params& p, int64_t, Group g, uint8_t* smem) {
    int32_t* ids_s = reinterpret_cast<int32_t*>(smem) + moe_group_smem_bytes(p.group.E) / 4;
    for (int t = g.warp(); t < p.select.M; t += g.num_warps()) router_select_work(p.select, t, g.lane(), ids_s);
    g.sync();
    if (p.group.M * p.group.K <= 32) moe_group_small_work(p.group, g, ids_s);
    else moe_group_work(p.group, g, reinterpret_cast<int32_t*>(smem), ids_s);
  }
};

}  // namespace m3::kernels
