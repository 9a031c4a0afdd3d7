// MSA indexer (native/indexer.h) against the CPU reference (ref::index_scores, block_max_pool,
// select_blocks) run on the same decoded index-K cache: every visible block score within a
// rigorous fp32 dot-product bound, selections equal as sets except where the reference's own
// block scores tie within that bound (each such row is reported with its gap); exact ties go to
// the lower block index; shuffled block tables give bitwise identical results; padding rows
// select nothing.
#include <algorithm>
#include <cmath>
#include <set>

#include "native/indexer.h"
#include "ref/indexer.h"
#include "test_attention_common.h"

using namespace m3;
using namespace m3::test;
using namespace m3::test::cache_tests;

namespace {

struct IndexCase {
  const char* name;
  int IH, ID, bs, topk, local;
  DType dt;
  std::vector<std::pair<int, int>> seqs;
  int pad;
  bool identical_keys = false;  // every key the same vector: all block scores tie exactly
};

struct IndexRun {
  std::vector<int32_t> selected;   // [T, IH, topk]
  std::vector<float> block_scores; // [T, IH, mqb]
  int mqb = 0;
};

// Runs the indexer for one placement of the blocks (scenario) over the same logical keys.
IndexRun run_gpu(const IndexCase& c, const Scenario& sc, const std::vector<std::vector<float>>& keys, float scale,
                 const std::vector<float>& iq) {
  const auto& meta = sc.meta;
  const int T = meta.num_tokens;
  native::KvCacheShape shape;
  shape.num_layers = 1;
  shape.num_blocks = sc.num_blocks;
  shape.block_size = c.bs;
  shape.kv_heads = 1;
  shape.head_dim = 16;
  shape.index_dim = c.ID;
  shape.ik_dtype = c.dt;
  shape.has_index = {1};
  native::DeviceKvCache cache(shape);
  cache.set_scales(0, 1.f, 1.f, scale);
  std::vector<uint8_t> img(shape.ik_bytes(), 0xff);  // unwritten slots decode to NaN
  for (size_t i = 0; i < sc.seqs.size(); ++i) store_rows(c.dt, scale, keys[i], c.ID, request_slots(sc, i), img);
  auto view = cache.layer(0);
  M3_CUDA_CHECK(cudaMemcpy(view.ik, img.data(), img.size(), cudaMemcpyHostToDevice));

  native::DeviceStepMetadata dmeta(T, int(sc.seqs.size()), meta.table_width);
  dmeta.upload(meta, nullptr);
  DevBuf<float> d_iq(iq);
  size_t ws = native::indexer_workspace_bytes(T, c.IH, meta.max_context, c.bs);
  DevBuf<float> work(ws / sizeof(float));
  work.poison();
  DevBuf<int32_t> sel(size_t(T) * c.IH * c.topk);
  sel.poison(0x7f);
  native::IndexerArgs a;
  a.iq = d_iq.p;
  a.index_heads = c.IH;
  a.index_dim = c.ID;
  a.topk = c.topk;
  a.local = c.local;
  a.workspace = work.p;
  a.workspace_bytes = ws;
  a.selected = sel.p;
  native::indexer_select(a, dmeta.view(), view, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  IndexRun r;
  r.selected = sel.download();
  r.block_scores = work.download();
  r.mqb = (meta.max_context + c.bs - 1) / c.bs;
  return r;
}

void run_case(const IndexCase& c) {
  Rng rng;
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << rng.seed);
  Scenario sc = make_padded_scenario(c.seqs, c.bs, c.pad, rng.gen);
  const auto& meta = sc.meta;
  const int T = meta.num_tokens;

  // Logical keys per request [len, ID] and queries [T, IH, ID].
  std::vector<std::vector<float>> keys;
  auto one = rng.normals(size_t(c.ID));
  for (auto [s, n] : c.seqs) {
    size_t len = size_t(s + n);
    if (c.identical_keys) {
      std::vector<float> k(len * size_t(c.ID));
      for (size_t p = 0; p < len; ++p) std::copy(one.begin(), one.end(), k.begin() + ptrdiff_t(p * size_t(c.ID)));
      keys.push_back(std::move(k));
    } else {
      keys.push_back(rng.normals(len * size_t(c.ID), 1.3f));
    }
  }
  const float scale = c.dt == DType::BF16 ? 1.f : fp8_scale_for(5.5f, rng);
  auto iq = rng.normals(size_t(T) * c.IH * c.ID);
  // The reference reads the decoded cache (same rounding as the GPU's reads).
  std::vector<std::vector<float>> deq;
  {
    std::vector<uint8_t> scratch(size_t(sc.num_blocks) * c.bs * c.ID * elem_bytes(c.dt));
    for (size_t i = 0; i < c.seqs.size(); ++i) deq.push_back(store_rows(c.dt, scale, keys[i], c.ID, request_slots(sc, i), scratch));
  }

  IndexRun g = run_gpu(c, sc, keys, scale, iq);

  size_t score_bad = 0, rows_diff = 0, rows_diff_untied = 0;
  double worst_score_ratio = 0, worst_gap = 0;
  for (int t = 0; t < T; ++t) {
    const int pos = meta.positions[size_t(t)];
    for (int h = 0; h < c.IH; ++h) {
      const int32_t* gs = g.selected.data() + (size_t(t) * c.IH + h) * c.topk;
      if (pos < 0) {
        for (int i = 0; i < c.topk; ++i) EXPECT_EQ(gs[i], -1) << "padding row " << t;
        continue;
      }
      const int seq = meta.token_seq[size_t(t)];
      const float* q = iq.data() + (size_t(t) * c.IH + h) * c.ID;
      const int n = pos + 1, nb = pos / c.bs + 1;
      std::vector<int64_t> slots(static_cast<size_t>(n));
      std::iota(slots.begin(), slots.end(), 0);
      std::vector<float> scores(static_cast<size_t>(n));
      ref::index_scores(q, deq[size_t(seq)].data(), c.ID, slots.data(), n, c.ID, scores.data());
      auto B = ref::block_max_pool(scores.data(), n, c.bs);
      auto want = ref::select_blocks(B.data(), nb, pos / c.bs, c.topk, c.local);
      // Rigorous bound of an fp32 dot of ID terms (plus the scale multiply and the reference's own
      // rounding to float): (ID + 2) u sum |q_d k_d| + ulp(|B|).
      std::vector<double> tol(size_t(nb), 0);
      for (int j = 0; j < n; ++j) {
        double sa = 0;
        const float* k = deq[size_t(seq)].data() + size_t(j) * c.ID;
        for (int d = 0; d < c.ID; ++d) sa += std::fabs(double(q[d]) * double(k[d]));
        double tj = (c.ID + 2) * std::ldexp(1.0, -24) * sa + std::ldexp(std::fabs(double(scores[size_t(j)])), -23);
        tol[size_t(j / c.bs)] = std::max(tol[size_t(j / c.bs)], tj);
      }
      const float* gb = g.block_scores.data() + (size_t(t) * c.IH + h) * g.mqb;
      for (int b = 0; b < nb; ++b) {
        double d = std::fabs(double(gb[b]) - double(B[size_t(b)]));
        double ratio = std::isnan(gb[b]) ? INFINITY : d / tol[size_t(b)];
        worst_score_ratio = std::max(worst_score_ratio, ratio);
        if (!(ratio <= 1.0)) {
          if (score_bad++ < 5)
            ADD_FAILURE() << "block score t " << t << " g " << h << " block " << b << ": gpu " << gb[b] << " ref "
                          << B[size_t(b)] << " tol " << tol[size_t(b)];
        }
      }
      // Selections: sorted ascending, -1 padded.
      std::vector<int32_t> got;
      for (int i = 0; i < c.topk; ++i) {
        if (gs[i] < 0) {
          for (int k = i; k < c.topk; ++k) EXPECT_EQ(gs[k], -1) << "t " << t << " g " << h;
          break;
        }
        got.push_back(gs[i]);
      }
      EXPECT_TRUE(std::is_sorted(got.begin(), got.end()) && std::adjacent_find(got.begin(), got.end()) == got.end())
          << "t " << t << " g " << h << " not strictly ascending";
      if (got == want) continue;
      ++rows_diff;
      // Allowed only where the reference's scores of the swapped blocks tie within the bound.
      std::vector<int32_t> only_g, only_r;
      std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(only_g));
      std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(only_r));
      bool tied = only_g.size() == only_r.size();
      double gap = 0;
      for (int32_t a : only_g)
        for (int32_t b : only_r) {
          if (a < 0 || a >= nb) { tied = false; continue; }
          double d = std::fabs(double(B[size_t(a)]) - double(B[size_t(b)]));
          gap = std::max(gap, d);
          if (d > tol[size_t(a)] + tol[size_t(b)]) tied = false;
        }
      worst_gap = std::max(worst_gap, gap);
      std::printf("  [%s] t %d g %d: selection differs from the reference at a tie, reference gap %.3g\n", c.name, t, h,
                  gap);
      if (!tied) {
        ++rows_diff_untied;
        ADD_FAILURE() << "t " << t << " g " << h << ": selection differs beyond a tie (gap " << gap << ")";
      }
    }
  }
  EXPECT_EQ(score_bad, 0u);
  std::printf("  [%s] %d rows x %d groups: worst block-score error %.3f of its bound; %zu rows differ at ties "
              "(worst reference gap %.3g)\n",
              c.name, T, c.IH, worst_score_ratio, rows_diff, worst_gap);
  EXPECT_EQ(rows_diff_untied, 0u);
  if (c.identical_keys) {
    EXPECT_EQ(rows_diff, 0u) << "exact ties must go to the lower block index";
  }

  // fn(t, h, b, i) for every visible block score (index i in a run's block_scores)
  auto each_visible = [&](auto fn) {
    for (int t = 0; t < T; ++t) {
      const int pos = meta.positions[size_t(t)];
      if (pos < 0) continue;
      for (int h = 0; h < c.IH; ++h)
        for (int b = 0; b <= pos / c.bs; ++b) fn(t, h, b, (size_t(t) * c.IH + h) * g.mqb + size_t(b));
    }
  };

  // Same logical keys in a different physical placement: bitwise the same results.
  Scenario sc2 = make_scenario(c.seqs, c.bs, sc.meta.num_tokens, rng.gen, 7);
  IndexRun g2 = run_gpu(c, sc2, keys, scale, iq);
  EXPECT_EQ(g2.selected, g.selected) << "selection depends on block placement";
  size_t mism = 0;
  each_visible([&](int, int, int, size_t i) { mism += std::memcmp(&g.block_scores[i], &g2.block_scores[i], 4) != 0; });
  EXPECT_EQ(mism, 0u) << "block scores depend on block placement";

  // One token per score item and tiles of kIndexerTokTile tokens (the prefill item: a block's keys
  // copied once for a run of one request's tokens, tiles crossing requests and padding rows):
  // bitwise the same scores and selections. The default run above took one of them by T.
  IndexRun by[2];
  for (int i = 0; i < 2; ++i) {
    native::indexer_set_token_tile(i == 0 ? 1 : kernels::kIndexerTokTile);
    by[i] = run_gpu(c, sc, keys, scale, iq);
  }
  native::indexer_set_token_tile(-1);
  EXPECT_EQ(by[1].selected, by[0].selected) << "selection depends on the token tile";
  EXPECT_EQ(by[0].selected, g.selected) << "selection depends on the token tile";
  size_t tile_mism = 0, compared = 0, unwritten = 0;
  each_visible([&](int t, int h, int b, size_t i) {
    if (std::isnan(by[1].block_scores[i]) && !std::isnan(by[0].block_scores[i]) && unwritten++ < 5)
      ADD_FAILURE() << "t " << t << " g " << h << " block " << b << ": the tiled item left a visible score unwritten";
    tile_mism += std::memcmp(&by[0].block_scores[i], &by[1].block_scores[i], 4) != 0;
    ++compared;
  });
  EXPECT_EQ(tile_mism, 0u) << "block scores depend on the token tile";
  std::printf("  [%s] %zu block scores bitwise equal with 1 and %d tokens per item\n", c.name, compared,
              kernels::kIndexerTokTile);
}

}  // namespace

TEST(GpuIndexer, RealShapesFp8) {
  run_case({"real fp8", 4, 128, 128, 16, 1, DType::F8_E4M3,
            {{0, 1}, {99, 1}, {127, 1}, {128, 1}, {4095, 1}, {10000, 1}, {1990, 64}}, 3});
}
TEST(GpuIndexer, RealShapesBf16) {
  run_case({"real bf16", 4, 128, 128, 16, 1, DType::BF16, {{50, 1}, {2047, 1}, {3000, 20}}, 1});
}
TEST(GpuIndexer, OddShapes) {
  // 4800 and 3005 tokens at block 16: 300 / 188 blocks, more than one top-k pruning chunk.
  run_case({"odd fp8", 2, 64, 16, 3, 2, DType::F8_E4M3,
            {{3, 1}, {15, 1}, {16, 1}, {40, 1}, {700, 1}, {250, 30}, {4799, 1}, {3000, 5}}, 2});
  run_case({"odd bf16", 2, 64, 16, 3, 2, DType::BF16, {{0, 1}, {33, 1}, {500, 12}}, 0});
}
TEST(GpuIndexer, ExactTiesPickLowerBlocks) {
  // Every key equal: every block scores the same, so selection = local blocks + the lowest ids.
  run_case({"ties", 2, 64, 16, 4, 2, DType::F8_E4M3, {{200, 1}, {90, 10}, {2500, 1}}, 1, true});
}
