// Near-tie decision sharing: the CPU reference can take the discrete choices another backend made
// in the same step (its SelectionTrace: the indexer's block sets and the router's expert lists) and
// use them instead of its own, but only where the two differ by a tie within rounding in the
// reference's OWN scores. Random-weight MoE models are chaotic: a near-tie in a block top-k or an
// expert top-k that rounds one way on the GPU and the other way here flips a discrete choice on one
// side only, and everything after it legitimately diverges. Following such a choice removes that
// effect and nothing else; every other difference stays visible, and a choice that is not a
// near-tie is refused (the reference keeps its own and counts a real disagreement).
//
// Rule. An offered choice C (a block set, or an ordered expert list) is taken iff it is what the
// reference itself would choose after moving each candidate's score s_i by at most
// tie_rel * m_i, where m_i is the magnitude sum of that score's final dot product:
//   blocks:  s_b = max-pooled index score of block b; m_b = sum_d |iq_d * ik_{j*,d}| for the key j*
//            that attains the block's maximum (the first one);
//   experts: s_e = sigmoid(r_e) + bias_e with r_e = router_e . y; m_e = sigmoid'(r_e) *
//            sum_h |Wr_{e,h} * y_h| (the bias is exact on both sides; sigmoid' <= 1/4 carries the
//            logit's rounding into the choice score).
// That is: for every pair where C ranks x below y but the reference ranks x higher (x left out of
// C while y is in it, or, for experts, x placed after y), the relative gap
//   (s_x - s_y) / (m_x + m_y)
// must be <= tie_rel. Local blocks (+inf) can never be left out, -inf/NaN blocks never taken, and C
// must have the reference's own size with valid, distinct ids; otherwise the gap is +inf.
//
// The same rule applies to the rounding of cache entries (with the cache codec emulated,
// ref/cache_codec.h): a value the reference and the GPU compute a few 1e-6 apart can sit across a
// rounding midpoint, so the two caches then hold codes one step apart (2^-4 relative for FP8, 2^-8
// for BF16; an element small next to its vector, whose fp32 noise is relative to the vector's
// scale, can even be several codes apart), which moves every later score that reads the entry (an
// index-K entry: the key's score for every later query). An offered cache entry (another backend's
// read-back value of the same position, SelectionTrace::cache_*) is taken iff the codec stores it
// for some value within tie_rel * rms(vector) of the reference's own x, the vector being the
// entry's K or V head or index-K row; its relative gap is the distance from x to the nearest such
// value, over rms(vector).
//
// Tolerance (kTieRel = 2^-15 ~ 3.1e-5). It is set by the arithmetic of the backend being compared
// (u = 2^-24; m = the magnitude sum of a dot product; the reference accumulates in double and
// rounds once per op):
//   - plain fp32 work (norms, RoPE, attention, the indexer's scores, the fp32 router GEMV): a
//     reduction of n terms in any order is off by <= (n - 1) u m (index scores, n = 128: ~2^-17 m;
//     a random walk gives sqrt(n) u m ~ 0.7e-6 m), and each input carries the fp32 noise of the
//     residual stream, a few 1e-6 relative, entering scores linearly;
//   - the linear layers (kernels/mma_linear.cuh, every projection since cf50476): each fp32
//     activation is split into bf16 hi + lo, |x - hi - lo| <= 2^-18 |x|, so a projection output is
//     off by up to 2^-18 m from the split alone, plus the tensor cores' fp32 accumulation (exact
//     bf16 products, sums that truncate inside a k16 step: ~2^-23 per k-step, a random walk of
//     ~2^-18 m over K = 6144), i.e. ~2^-17 m, carried through q/k norm and RoPE into every K, V and
//     index-K entry (relative to the vector's rms) and every score.
// 2^-15 covers that estimate by a factor ~4 (the H200 run of 2026-11-30 with the earlier 2^-17,
// which was derived for fp32 GEMVs only, refused 0.25% of FP8 cache entries with gaps from 7.6e-6
// up; docs/native-backend.md). It stays far below every other rounding the GPU can do (bf16:
// 2^-9, 64x more; FP8: 2^-4): a flip caused by such a rounding (bf16-rounded GEMM activations, an
// FP8 cache code that rounds the other way without a tie) is still refused and reported, not
// hidden. The router's worst case (n - 1) u m is larger still (6e-5 at n = 1024) and is
// deliberately NOT allowed.
//
// Cache entries (kCacheTieRel = 2^-14 ~ 6.1e-5). Their gap is measured against the rms of the
// entry's vector (a K or V head, an index-K row), not against the element itself: the deviation of
// element j, a random walk of the split and accumulation errors over its dot product, is about
// 2^-17 |x_j| (above), so relative to the rms it grows with |x_j| / rms, up to ~5 for the largest
// of the ~10^7 entries of a run (a roughly Gaussian head vector): ~2^-14.7. The H200 run of
// 2026-11-30 (real-heads and tiny-m3-a, FP8 and BF16 caches, 26M entries) saw at most 3.2e-5
// (2^-14.9) with 2^-15 in force (3 entries refused just above it); 2^-14 is still 32x below a bf16
// rounding and 2^10 x below an FP8 step.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ref/cache_codec.h"
#include "runtime/backend.h"

namespace m3::ref {

inline constexpr double kTieRel = 0x1p-15;
inline constexpr double kCacheTieRel = 0x1p-14;

struct FollowOptions {
  double block_tie_rel = kTieRel;
  double expert_tie_rel = kTieRel;
  double cache_tie_rel = kCacheTieRel;
};

// Counts of one kind of choice.
struct FollowCount {
  int64_t offered = 0, differ = 0, followed = 0, refused = 0;
  double max_taken = 0;  // largest relative gap of a followed choice
  double min_refused = std::numeric_limits<double>::infinity();  // smallest relative gap refused
  void add(double gap, double tie_rel) {  // one offered choice that differs from the own one
    ++differ;
    if (gap <= tie_rel) {
      ++followed;
      if (gap > max_taken) max_taken = gap;
    } else {
      ++refused;
      if (gap < min_refused) min_refused = gap;
    }
  }
  void merge(const FollowCount& o);
};

// What the reference did with the offered choices of one or more steps.
struct FollowStats {
  int64_t block_sets = 0, block_differ = 0, block_followed = 0, block_refused = 0;
  int64_t expert_lists = 0, expert_differ = 0, expert_followed = 0, expert_refused = 0;
  double block_max_taken = 0, expert_max_taken = 0;  // largest relative gap of a followed choice
  double block_min_refused = std::numeric_limits<double>::infinity();   // smallest relative gap refused
  double expert_min_refused = std::numeric_limits<double>::infinity();
  FollowCount cache;          // cache entries (elements of K, V and index-K)
  std::string first_refused;  // where the first refused choice was, and its gap
  void merge(const FollowStats& o);
  int64_t followed() const { return block_followed + expert_followed + cache.followed; }
  int64_t refused() const { return block_refused + expert_refused + cache.refused; }
};

// Relative gap (see the rule above) of an offered block set against the reference's block scores
// [0, num_blocks) of a query in block query_block (select_blocks' conventions: `local` blocks up to
// query_block forced to +inf, top min(topk, num_blocks) kept, -inf/NaN never kept). magnitude(b)
// gives m_b (called only for the blocks a violating pair involves). 0 when C is the reference's own
// choice up to ties; +inf when C is invalid or leaves out a local block.
double block_choice_gap(const float* block_scores, int num_blocks, int query_block, int topk, int local,
                        const std::vector<int32_t>& offered, const std::function<double(int)>& magnitude);

// Relative gap of an offered expert list (best first) against the reference's choice scores
// [num_experts] (sigmoid + bias) with magnitudes m_e [num_experts]; top_k = the list's required size.
double expert_choice_gap(const double* choice, const double* magnitude, int num_experts, int top_k,
                         const std::vector<int32_t>& offered);

// Stores x[0..n) (one K or V head, or one index-K row) through codec c into dst; with offered
// read-back values (non-null), each element whose offered value differs from the codec's own
// rounding takes it iff the cache rule above allows (counted in cnt; the first refused element's
// index and gap in *first_refused / *first_gap when those are given and it is the first).
void store_following(const CacheCodec& c, const float* x, int n, const float* offered, double tie_rel, float* dst,
                     FollowCount& cnt, int* first_refused = nullptr, double* first_gap = nullptr);

// One step's decisions to follow: `decisions` is another backend's trace of this very step (same
// batch); an empty blocks or experts part offers nothing of that kind. stats accumulates.
struct Follow {
  const SelectionTrace* decisions = nullptr;
  FollowOptions opt;
  FollowStats* stats = nullptr;
};

}  // namespace m3::ref
