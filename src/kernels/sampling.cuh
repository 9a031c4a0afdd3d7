// Sampling on the device: the same token as runtime/sampler.cpp's sample_token for each requested
// row of fp32 logits.
//
// Math (per job j: row r, temperature T, top_k, top_p, draw u = rng::uniform_draw(seed, draw)):
//   greedy (T == 0): the lowest id among the largest logits (NaN: error; all -inf gives id 0, as
//     argmax_token) -- bitwise the CPU's result: comparisons only.
//   stochastic: candidates in best-first order (logit desc, id asc; -0.0 == +0.0), the first
//     k = top_k ? min(top_k, V) : V of them; top = the first logit (-inf: error);
//     w_i = (l_i == top) ? 1 : exp((double(l_i) - top) * (1.0 / double(T)))  (double, as the CPU);
//     z = sum w_i; with top_p < 1, n = the smallest prefix with P_n / z >= top_p (else n = k), where
//     P_i = w_0 + ... + w_i; the token is the first i < n with u < P_i / P_n (P_n = z when top-p is
//     off); if none (u within rounding of 1), the last i < n with w_i > 0.
//   NOT bitwise the CPU: the CPU sums w_i / z one by one in best-first order; here each thread sums
//   a contiguous run of candidates and a block scan combines the runs, and device exp() may differ
//   from the host's by an ulp. So the token equals the CPU's except when u (or top_p) falls within
//   double rounding (~1e-15 relative) of a cumulative boundary; with random u that is never seen
//   in practice (tests/gpu/test_sampling.cpp counts such cases separately).
//
// Layouts: logits [*][ld] fp32 (job.row picks the row), V = vocab; jobs [J]; tokens, status [J]
//   int32 (status: kernels/sampling_job.h). Stochastic scratch for G rows at a time: keys and
//   sorted [G][V] uint64, nan_first [G] int32 (set to a value >= V before the prep pass).
//   A candidate key packs the order into one integer: key = ((G - 1 - g) << (32 + id_bits)) |
//   (ordered(l) << id_bits) | (2^id_bits - 1 - id), g the row in the group, ordered() the monotone
//   unsigned image of a float with -0.0 mapped to +0.0; one device-wide descending radix sort of
//   the G * V keys then leaves row g's candidates at [g * V, (g + 1) * V) in best-first order,
//   without relying on sort stability.
//
// Work items: greedy and pick are one block (kSampleThreads threads) per job; prep is one thread
// per (group row, element).
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cmath>
#include <cstdint>

#include "core/counter_rng.h"
#include "kernels/sampling_job.h"
#include "kernels/work_kernel.cuh"

namespace m3::kernels {

constexpr int kSampleThreads = 512;

struct SampleParams {
  const float* logits = nullptr;  // [*][ld]
  int64_t ld = 0;
  int vocab = 0;
  const SampleJob* jobs = nullptr;  // [J]
  const int32_t* list = nullptr;    // work item -> job index (greedy jobs, or this group's stochastic jobs)
  int32_t* tokens = nullptr;        // [J]
  int32_t* status = nullptr;        // [J]
  uint64_t* keys = nullptr;         // [G][V] prep output
  const uint64_t* sorted = nullptr; // [G][V] keys sorted descending
  int32_t* nan_first = nullptr;     // [G]
  int id_bits = 0;
  int group = 0;  // G: rows of this group
};

__device__ __forceinline__ uint32_t sample_ordered(float f) {
  uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);  // -0.0 -> +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float sample_unordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

struct SampleArgBest {
  float v;
  int32_t i;    // best id (INT32_MAX: none yet)
  int32_t nan;  // lowest NaN id (INT32_MAX: none)
};

struct SampleArgBestOp {
  __device__ __forceinline__ SampleArgBest operator()(const SampleArgBest& a, const SampleArgBest& b) const {
    SampleArgBest r = (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b;
    r.nan = min(a.nan, b.nan);
    return r;
  }
};

using SampleGreedyReduce = cub::BlockReduce<SampleArgBest, kSampleThreads>;

// Work item w = greedy job p.list[w]; a whole-CTA group of kSampleThreads threads (the CUB block
// primitives number the threads of the CTA themselves).
__device__ __forceinline__ void sample_greedy_work(const SampleParams& p, int w, Group grp,
                                                   typename SampleGreedyReduce::TempStorage& tmp) {
  const int tid = grp.tid;
  const int j = p.list[w];
  const float* l = p.logits + p.jobs[j].row * p.ld;
  SampleArgBest b{-INFINITY, INT32_MAX, INT32_MAX};
  for (int i = tid; i < p.vocab; i += kSampleThreads) {
    const float x = l[i];
    if (isnan(x)) {
      b.nan = min(b.nan, i);
    } else if (x > b.v || (x == b.v && i < b.i)) {
      b.v = x;
      b.i = i;
    }
  }
  const SampleArgBest r = SampleGreedyReduce(tmp).Reduce(b, SampleArgBestOp{});
  if (tid == 0) {
    const bool nan = r.nan != INT32_MAX;
    p.tokens[j] = nan ? -1 : (r.i == INT32_MAX ? 0 : r.i);
    p.status[j] = nan ? 1 + r.nan : kSampleOk;
  }
}

// Work item (g, i): group row g (job p.list[g]), element i < V: its key, and NaN detection.
__device__ __forceinline__ void sample_prep_work(const SampleParams& p, int g, int i) {
  const int j = p.list[g];
  const float x = p.logits[p.jobs[j].row * p.ld + i];
  if (isnan(x)) atomicMin(p.nan_first + g, i);
  const uint64_t mask = (uint64_t(1) << p.id_bits) - 1;
  p.keys[int64_t(g) * p.vocab + i] = (uint64_t(p.group - 1 - g) << (32 + p.id_bits)) |
                                     (uint64_t(sample_ordered(x)) << p.id_bits) | (mask - uint64_t(i));
}

struct SamplePickStorage {
  union {
    cub::BlockScan<double, kSampleThreads>::TempStorage scan;
    cub::BlockReduce<int, kSampleThreads>::TempStorage reduce;
  } cub;
  int found;
  double found_p;
};

// Work item g = group row (job p.list[g]) over its sorted candidates; a whole-CTA group of
// kSampleThreads threads (CUB block primitives).
__device__ __forceinline__ void sample_pick_work(const SampleParams& p, int g, Group grp, SamplePickStorage& sm) {
  const int tid = grp.tid;
  const int j = p.list[g];
  const SampleJob job = p.jobs[j];
  const int V = p.vocab;
  if (p.nan_first[g] < V) {  // uniform across the block
    if (tid == 0) {
      p.tokens[j] = -1;
      p.status[j] = 1 + p.nan_first[g];
    }
    return;
  }
  const uint64_t* keys = p.sorted + int64_t(g) * V;
  const uint64_t mask = (uint64_t(1) << p.id_bits) - 1;
  const double top = double(sample_unordered(uint32_t(keys[0] >> p.id_bits)));
  if (top == -INFINITY) {
    if (tid == 0) {
      p.tokens[j] = -1;
      p.status[j] = kSampleAllNegInf;
    }
    return;
  }
  const int k = job.top_k > 0 ? min(job.top_k, V) : V;
  const double inv_t = 1.0 / double(job.temperature);
  auto weight = [&](int i) {
    const double l = double(sample_unordered(uint32_t(keys[i] >> p.id_bits)));
    return l == top ? 1.0 : exp((l - top) * inv_t);
  };
  auto id_of = [&](int i) { return int32_t(mask - (keys[i] & mask)); };
  // Each thread owns the contiguous run [b0, b1) of candidates.
  const int per = (k + kSampleThreads - 1) / kSampleThreads;
  const int b0 = min(k, tid * per), b1 = min(k, b0 + per);
  double s = 0;
  int npos = 0;
  for (int i = b0; i < b1; ++i) {
    const double w = weight(i);
    s += w;
    npos += w > 0;
  }
  double base = 0, z = 0;
  cub::BlockScan<double, kSampleThreads>(sm.cub.scan).ExclusiveSum(s, base, z);
  grp.sync();
  npos = cub::BlockReduce<int, kSampleThreads>(sm.cub.reduce).Sum(npos);  // valid in thread 0
  if (tid == 0) {
    sm.found = npos;  // temporarily: the count of positive weights
  }
  grp.sync();
  npos = sm.found;
  grp.sync();

  // First index of a thread's run where cond(P_i) holds, P_i summed from the run's base.
  auto first_where = [&](auto cond, int limit, double& p_at) {
    if (tid == 0) {
      sm.found = INT32_MAX;
      sm.found_p = 0;
    }
    grp.sync();
    double P = base;
    int mine = INT32_MAX;
    for (int i = b0; i < min(b1, limit); ++i) {
      P += weight(i);
      if (cond(P)) {
        mine = i;
        break;
      }
    }
    if (mine != INT32_MAX) atomicMin(&sm.found, mine);
    grp.sync();
    if (mine != INT32_MAX && mine == sm.found) sm.found_p = P;
    grp.sync();
    const int f = sm.found;
    p_at = sm.found_p;
    grp.sync();
    return f;
  };

  int n = k;
  double pn = z;
  if (job.top_p < 1.0f) {
    const double tp = double(job.top_p);
    double pf = 0;
    const int f = first_where([&](double P) { return P / z >= tp; }, k, pf);
    if (f != INT32_MAX) {
      n = f + 1;
      pn = pf;
    }
  }
  const double u = rng::uniform_draw(job.seed, job.draw);
  double unused = 0;
  const int f = first_where([&](double P) { return u < P / pn; }, n, unused);
  if (tid == 0) {
    const int pick = f != INT32_MAX ? f : min(n, npos) - 1;
    p.tokens[j] = id_of(pick);
    p.status[j] = kSampleOk;
  }
}

// ---- the ops (shapes in native/sampling.cu: CUB's storage sizes are known there) ----
struct SampleGreedyOp : OpBounds<kSampleThreads> {
  using Params = SampleParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    sample_greedy_work(p, int(w), g, *reinterpret_cast<typename SampleGreedyReduce::TempStorage*>(smem));
  }
};
constexpr int kSamplePrepThreads = 256;
// Item = (slice of 256 elements, group row), slice fastest.
struct SamplePrepOp : OpBounds<kSamplePrepThreads> {
  using Params = SampleParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t*) {
    const int64_t slices = ceil_div(p.vocab, kSamplePrepThreads);
    const int i = int(w % slices) * kSamplePrepThreads + g.tid;
    if (i < p.vocab) sample_prep_work(p, int(w / slices), i);
  }
};
struct SamplePickOp : OpBounds<kSampleThreads> {
  using Params = SampleParams;
  __device__ static void run(const Params& p, int64_t w, Group g, uint8_t* smem) {
    sample_pick_work(p, int(w), g, *reinterpret_cast<SamplePickStorage*>(smem));
  }
};

}  // namespace m3::kernels
