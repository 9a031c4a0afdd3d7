// Paged attention (native/attention.h) against the CPU reference (ref::attend_head) on the same
// decoded K/V cache: block-sparse over random block selections (local block always in, some rows
// with fewer than topk blocks) and dense causal; decode rows, prefill chunks, contexts below one
// block, at and just past block edges and beyond topk blocks; several split counts (the combine
// path included) and chunk sizes; padding rows give zeros; shuffled block tables give bitwise the
// same output; and every split count gives bitwise the same output as one block per row (the
// batch-invariance contract of kernels/attention.cuh).
#include <algorithm>
#include <cmath>
#include <span>
#include <thread>

#include "common/compare.h"
#include "native/attention.h"
#include "ref/attention.h"
#include "test_attention_common.h"

using namespace m3;
using namespace m3::test;
using namespace m3::test::cache_tests;

namespace {

struct AttnCase {
  const char* name;
  int H, KV, D, bs, topk;
  DType dt;
  bool sparse;
  std::vector<std::pair<int, int>> seqs;
  int pad;
  std::vector<int> splits;  // 0 = automatic
};

struct Data {
  std::vector<std::vector<float>> k, v;  // per request, logical [len, KV, D]
  std::vector<float> q;                  // [T, H, D]
  std::vector<int32_t> sel;              // [T, KV, topk] (sparse)
  float ks = 1, vs = 1;
};

// The split items' own top-k (AttentionParams::topk_scores): block scores [T, KV, mqb] with local
// forced blocks; the lists the items write to `selected` come back in *written.
struct OwnTopk {
  const std::vector<float>* scores;
  int mqb, local;
  std::vector<int32_t>* written;
};

std::vector<float> run_gpu(const AttnCase& c, const Scenario& sc, const Data& in, int splits, int* used_splits,
                           std::vector<std::vector<float>>* kd = nullptr, std::vector<std::vector<float>>* vd = nullptr,
                           int tiles_per_chunk = native::kDefaultTilesPerChunk, const OwnTopk* own = nullptr) {
  const auto& meta = sc.meta;
  const int T = meta.num_tokens;
  native::KvCacheShape shape;
  shape.num_layers = 1;
  shape.num_blocks = sc.num_blocks;
  shape.block_size = c.bs;
  shape.kv_heads = c.KV;
  shape.head_dim = c.D;
  shape.kv_dtype = c.dt;
  shape.has_index = {0};
  native::DeviceKvCache cache(shape);
  cache.set_scales(0, in.ks, in.vs);
  std::vector<uint8_t> kimg(shape.kv_bytes(), 0xff), vimg(shape.kv_bytes(), 0xff);  // unwritten = NaN
  for (size_t i = 0; i < sc.seqs.size(); ++i) {
    auto slots = request_slots(sc, i);
    auto a = store_rows(c.dt, in.ks, in.k[i], c.KV * c.D, slots, kimg);
    auto b = store_rows(c.dt, in.vs, in.v[i], c.KV * c.D, slots, vimg);
    if (kd) kd->push_back(std::move(a));
    if (vd) vd->push_back(std::move(b));
  }
  auto view = cache.layer(0);
  M3_CUDA_CHECK(cudaMemcpy(view.k, kimg.data(), kimg.size(), cudaMemcpyHostToDevice));
  M3_CUDA_CHECK(cudaMemcpy(view.v, vimg.data(), vimg.size(), cudaMemcpyHostToDevice));
  native::DeviceStepMetadata dmeta(T, int(sc.seqs.size()), meta.table_width);
  dmeta.upload(meta, nullptr);
  DevBuf<float> dq(in.q), out(size_t(T) * c.H * c.D);
  out.poison();
  DevBuf<int32_t> dsel(c.sparse ? in.sel : std::vector<int32_t>{0});
  DevBuf<float> dscores(own ? *own->scores : std::vector<float>{0.f});
  native::AttentionArgs a;
  a.q = dq.p;
  a.num_heads = c.H;
  a.selected = c.sparse ? dsel.p : nullptr;
  a.topk = c.sparse ? c.topk : 0;
  if (own) {
    dsel.poison(0x7f);  // block 0x7f7f7f7f: the items write the lists (and must not read these)
    a.topk_scores = dscores.p;
    a.max_q_blocks = own->mqb;
    a.topk_local = own->local;
  }
  a.num_splits = splits;
  a.tiles_per_chunk = tiles_per_chunk;
  // Workspace for every chunk of the longest key list.
  int max_tiles = native::attention_max_tiles(c.sparse, c.topk, c.bs, meta.max_context);
  size_t ws = std::max<size_t>(16, native::attention_workspace_bytes(T, c.H, c.KV, c.D,
                                                                     native::attention_chunks(max_tiles, tiles_per_chunk)));
  DevBuf<uint8_t> work(ws);
  work.poison();
  a.workspace = work.p;
  a.workspace_bytes = ws;
  a.out = out.p;
  *used_splits = native::attention_forward(a, dmeta.view(), view, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  if (own) *own->written = dsel.download();
  return out.download();
}

void run_case(const AttnCase& c) {
  Rng rng;
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << rng.seed);
  Scenario sc = make_padded_scenario(c.seqs, c.bs, c.pad, rng.gen);
  const auto& meta = sc.meta;
  const int T = meta.num_tokens, G = c.H / c.KV;

  Data in;
  for (auto [s, n] : c.seqs) {
    in.k.push_back(rng.normals(size_t(s + n) * c.KV * c.D));
    in.v.push_back(rng.normals(size_t(s + n) * c.KV * c.D, 1.5f));
  }
  in.q = rng.normals(size_t(T) * c.H * c.D, 1.5f);
  in.ks = c.dt == DType::BF16 ? 1.f : fp8_scale_for(4.5f, rng);
  in.vs = c.dt == DType::BF16 ? 1.f : fp8_scale_for(6.5f, rng);
  if (c.sparse) {
    in.sel.assign(size_t(T) * c.KV * c.topk, -1);
    for (int t = 0; t < T; ++t) {
      int pos = meta.positions[size_t(t)];
      if (pos < 0) continue;
      int qb = pos / c.bs, nb = qb + 1;
      for (int g = 0; g < c.KV; ++g) {
        std::vector<int32_t> ids(static_cast<size_t>(qb));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng.gen);
        int keep = std::min(c.topk, nb) - 1;
        if (keep > 0 && rng.uniform_int(0, 3) == 0) keep -= rng.uniform_int(1, keep);  // fewer than topk
        ids.resize(size_t(std::max(keep, 0)));
        ids.push_back(qb);  // the local block
        std::sort(ids.begin(), ids.end());
        std::copy(ids.begin(), ids.end(), in.sel.begin() + ptrdiff_t((size_t(t) * c.KV + g) * c.topk));
      }
    }
  }

  std::vector<std::vector<float>> kd, vd;
  std::vector<std::vector<float>> outs;
  std::vector<int> used;
  for (size_t i = 0; i < c.splits.size(); ++i) {
    int u = 0;
    outs.push_back(run_gpu(c, sc, in, c.splits[i], &u, i == 0 ? &kd : nullptr, i == 0 ? &vd : nullptr));
    used.push_back(u);
  }

  // Reference on the decoded caches, threads over rows.
  std::vector<float> ref(size_t(T) * c.H * c.D, 0.f);
  float vmax = 0;
  for (auto& v : vd)
    for (float x : v) vmax = std::max(vmax, std::fabs(x));
  {
    const double scale = 1.0 / std::sqrt(double(c.D));
    auto work = [&](int t0, int step) {
      std::vector<int64_t> slots;
      for (int t = t0; t < T; t += step) {
        int pos = meta.positions[size_t(t)];
        if (pos < 0) continue;  // padding rows: zeros
        int seq = meta.token_seq[size_t(t)];
        for (int h = 0; h < c.H; ++h) {
          int g = h / G;
          slots.clear();
          if (c.sparse) {
            const int32_t* s = in.sel.data() + (size_t(t) * c.KV + g) * c.topk;
            for (int i = 0; i < c.topk && s[i] >= 0; ++i)
              for (int off = 0; off < c.bs; ++off)
                if (int64_t(s[i]) * c.bs + off <= pos) slots.push_back(int64_t(s[i]) * c.bs + off);
          } else {
            for (int j = 0; j <= pos; ++j) slots.push_back(j);
          }
          ref::attend_head(in.q.data() + (size_t(t) * c.H + h) * c.D, kd[size_t(seq)].data() + size_t(g) * c.D,
                           vd[size_t(seq)].data() + size_t(g) * c.D, int64_t(c.KV) * c.D, slots.data(),
                           int(slots.size()), c.D, scale, ref.data() + (size_t(t) * c.H + h) * c.D);
        }
      }
    };
    unsigned nth = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (unsigned i = 0; i < nth; ++i) th.emplace_back(work, int(i), int(nth));
    for (auto& x : th) x.join();
  }
  // fp32 scores, exp and accumulation against double: observed ~1e-6 of max|V|; a key missing or
  // extra at the tested lengths (<= 2.5K keys) moves an output by >= ~1e-3 of max|V|.
  const double atol = 2e-5 * vmax, rtol = 1e-4;
  for (size_t i = 0; i < outs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "splits " << c.splits[i] << " (used " << used[i] << ")");
    auto r = compare(outs[i], ref, atol, rtol);
    EXPECT_TRUE(r.ok) << r.describe();
    std::printf("  [%s] splits %d (used %d): %s\n", c.name, c.splits[i], used[i], r.describe().c_str());
  }

  // The tolerance can fail: at the row with the longest key list, drop its highest-scoring key
  // from the reference of head 0; the GPU output must then be rejected.
  {
    int best_t = -1;
    std::vector<int64_t> best;
    for (int t = 0; t < T; ++t) {
      int pos = meta.positions[size_t(t)];
      if (pos < 0) continue;
      std::vector<int64_t> slots;
      if (c.sparse) {
        const int32_t* s = in.sel.data() + size_t(t) * c.KV * c.topk;
        for (int i = 0; i < c.topk && s[i] >= 0; ++i)
          for (int off = 0; off < c.bs; ++off)
            if (int64_t(s[i]) * c.bs + off <= pos) slots.push_back(int64_t(s[i]) * c.bs + off);
      } else {
        for (int j = 0; j <= pos; ++j) slots.push_back(j);
      }
      if (slots.size() > best.size()) { best = slots; best_t = t; }
    }
    if (best.size() > 1) {
      const int seq = meta.token_seq[size_t(best_t)];
      const float* q = in.q.data() + size_t(best_t) * c.H * c.D;
      const float* k = kd[size_t(seq)].data();
      size_t drop = 0;
      double top = -INFINITY;
      for (size_t j = 0; j < best.size(); ++j) {
        double s = 0;
        for (int d = 0; d < c.D; ++d) s += double(q[d]) * k[size_t(best[j]) * c.KV * c.D + size_t(d)];
        if (s > top) { top = s; drop = j; }
      }
      best.erase(best.begin() + ptrdiff_t(drop));
      std::vector<float> mut(size_t(c.D));
      ref::attend_head(q, k, vd[size_t(seq)].data(), int64_t(c.KV) * c.D, best.data(), int(best.size()), c.D,
                       1.0 / std::sqrt(double(c.D)), mut.data());
      std::span<const float> got(outs[0].data() + size_t(best_t) * c.H * c.D, size_t(c.D));
      auto r = compare(got, mut, atol, rtol);
      EXPECT_FALSE(r.ok) << "dropping one of " << best.size() + 1 << " keys went unnoticed: " << r.describe();
    }
  }

  // Batch invariance: every split count gives the bits of one block per (token, KV group).
  {
    int u1 = 0;
    auto one = run_gpu(c, sc, in, 1, &u1);
    for (size_t i = 0; i < outs.size(); ++i) {
      size_t diff = 0, first = 0;
      for (size_t j = 0; j < one.size(); ++j)
        if (std::memcmp(&one[j], &outs[i][j], 4) != 0 && diff++ == 0) first = j;
      EXPECT_EQ(diff, 0u) << "splits " << c.splits[i] << " (used " << used[i] << ") differ from one block per row at "
                          << diff << " outputs, first " << first;
    }
    // A smaller chunk (1 tile) with many blocks per row: the same bits as itself with one block
    // per row, and within the tolerance of the reference.
    int ua = 0, ub = 0;
    auto a = run_gpu(c, sc, in, 0, &ua, nullptr, nullptr, 1);
    auto b = run_gpu(c, sc, in, 1, &ub, nullptr, nullptr, 1);
    size_t diff = 0;
    for (size_t j = 0; j < a.size(); ++j) diff += std::memcmp(&a[j], &b[j], 4) != 0;
    EXPECT_EQ(diff, 0u) << "1-tile chunks: " << ua << " blocks per row differ from 1 at " << diff << " outputs";
    auto r = compare(a, ref, atol, rtol);
    EXPECT_TRUE(r.ok) << "1-tile chunks: " << r.describe();
  }

  // The split items selecting their blocks themselves from block scores whose top-k is in.sel:
  // the local block forced whatever its score (finite, -inf or NaN); the other listed blocks finite
  // with exact ties among them; where a list is full, the unlisted visible blocks finite and beaten
  // (below the lowest kept score, or equal to it at a higher index: the tie at the cut-off), -inf
  // or NaN; where it is not full, -inf or NaN only; blocks past the position huge (never read as
  // candidates). Bitwise the output of the given lists at every split count, and those lists (-1
  // for padding rows) written to `selected` for every row.
  if (c.sparse) {
    const int mqb = (meta.max_context + c.bs - 1) / c.bs;
    std::vector<float> scores(size_t(T) * c.KV * size_t(mqb));
    auto never = [&] { return rng.uniform_int(0, 1) ? -INFINITY : std::nanf(""); };
    for (float& x : scores) x = never();
    size_t pruned = 0, cutoff_ties = 0;
    for (int t = 0; t < T; ++t) {
      const int pos = meta.positions[size_t(t)];
      if (pos < 0) continue;
      const int qb = pos / c.bs, nb = qb + 1;
      for (int g = 0; g < c.KV; ++g) {
        const int32_t* s = in.sel.data() + (size_t(t) * c.KV + g) * c.topk;
        float* row = scores.data() + (size_t(t) * c.KV + g) * size_t(mqb);
        std::vector<char> listed(size_t(nb), 0);
        int n = 0;
        float prev = 1.5f, lo = INFINITY;
        int lo_last = -1;  // the highest listed block (local aside) scoring lo
        for (; n < c.topk && s[n] >= 0; ++n) {
          listed[size_t(s[n])] = 1;
          if (s[n] == qb) {  // forced
            const int r = rng.uniform_int(0, 3);
            row[qb] = r == 0 ? -INFINITY : r == 1 ? std::nanf("") : r == 2 ? 0.25f : 3.f;
            continue;
          }
          row[s[n]] = prev = rng.uniform_int(0, 3) == 0 ? prev : rng.uniform(1.f, 2.f);
          if (prev < lo) lo = prev, lo_last = -1;
          if (prev == lo) lo_last = std::max(lo_last, int(s[n]));
        }
        const bool full = n == std::min(c.topk, nb);
        for (int b = 0; b < nb; ++b) {
          if (listed[size_t(b)]) continue;
          if (!full || rng.uniform_int(0, 3) == 0) continue;  // stays -inf / NaN
          ++pruned;
          if (lo == INFINITY) row[b] = rng.uniform(-4.f, 4.f);  // only the forced block listed
          else if (b > lo_last && rng.uniform_int(0, 1)) row[b] = lo, ++cutoff_ties;
          else row[b] = lo - rng.uniform(0.001f, 0.9f);
        }
        for (int b = nb; b < mqb; ++b) row[b] = rng.uniform_int(0, 1) ? 1e30f : INFINITY;
      }
    }
    std::printf("[own top-k] %zu visible unlisted blocks with finite scores, %zu of them tied with the cut-off\n",
                pruned, cutoff_ties);
    ASSERT_TRUE(kernels::attention_topk_fits(c.D, c.dt == DType::BF16 ? 2 : 1, mqb, c.topk)) << mqb << " blocks";
    for (size_t i = 0; i < c.splits.size(); ++i) {
      std::vector<int32_t> written;
      const OwnTopk own{&scores, mqb, 1, &written};
      int u = 0;
      auto got = run_gpu(c, sc, in, c.splits[i], &u, nullptr, nullptr, native::kDefaultTilesPerChunk, &own);
      size_t diff = 0, first = 0;
      for (size_t j = 0; j < got.size(); ++j)
        if (std::memcmp(&got[j], &outs[i][j], 4) != 0 && diff++ == 0) first = j;
      EXPECT_EQ(diff, 0u) << "own top-k, splits " << c.splits[i] << " (used " << u << "): " << diff
                          << " outputs differ from the given lists', first " << first;
      const std::vector<int32_t>& want = in.sel;  // (padding rows: all -1)
      size_t bad = 0, bad_first = 0;
      for (size_t j = 0; j < want.size(); ++j)
        if (written[j] != want[j] && bad++ == 0) bad_first = j;
      EXPECT_EQ(bad, 0u) << "own top-k, splits " << c.splits[i] << ": " << bad << " list entries differ, first "
                         << bad_first << " (" << written[bad_first] << " vs " << want[bad_first] << ")";
    }
  }

  // Same logical data in another block placement, same split count: bitwise equal.
  Scenario sc2 = make_scenario(c.seqs, c.bs, sc.meta.num_tokens, rng.gen, 5);
  int u2 = 0;
  auto out2 = run_gpu(c, sc2, in, c.splits[0], &u2);
  size_t diff = 0;
  for (size_t i = 0; i < out2.size(); ++i) diff += std::memcmp(&out2[i], &outs[0][i], 4) != 0;
  EXPECT_EQ(diff, 0u) << "output depends on block placement";
}

}  // namespace

TEST(GpuAttention, RealShapesSparseFp8) {
  run_case({"real sparse fp8", 64, 4, 128, 128, 16, DType::F8_E4M3, true,
            {{0, 1}, {76, 1}, {127, 1}, {128, 1}, {2999, 1}, {5000, 1}, {2100, 40}}, 3, {0, 1, 7}});
}
TEST(GpuAttention, RealShapesSparseBf16) {
  run_case({"real sparse bf16", 64, 4, 128, 128, 16, DType::BF16, true, {{300, 1}, {2600, 1}, {1000, 9}}, 1, {0, 3}});
}
TEST(GpuAttention, RealShapesDenseFp8) {
  run_case({"real dense fp8", 64, 4, 128, 128, 16, DType::F8_E4M3, false, {{0, 1}, {200, 1}, {2500, 1}, {1000, 20}},
            2, {0, 1}});
}
TEST(GpuAttention, OddShapes) {
  run_case({"odd sparse fp8", 8, 2, 64, 16, 3, DType::F8_E4M3, true,
            {{4, 1}, {15, 1}, {16, 1}, {99, 1}, {699, 1}, {300, 25}}, 2, {0, 1, 3}});
  run_case({"odd sparse bf16", 8, 2, 64, 16, 3, DType::BF16, true, {{0, 1}, {47, 1}, {640, 6}}, 1, {0, 2}});
  run_case({"odd dense bf16", 8, 2, 64, 16, 3, DType::BF16, false, {{0, 1}, {31, 1}, {250, 7}}, 1, {0, 1}});
  run_case({"odd G=1 dense fp8", 4, 4, 128, 16, 3, DType::F8_E4M3, false, {{5, 1}, {130, 3}}, 0, {0}});
}
