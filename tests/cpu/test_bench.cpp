// The benchmark framework's host side (bench/): count parsing, statistics (median, nearest-rank
// p90), the expected-distinct-experts model (against a Monte Carlo draw), step byte accounting
// (against an independent walk over every prepared tensor, a brute-force block selection and
// footprint.h), the regions a plain read of the step streams, shard / layer-cut specs, the JSON
// report, and the CPU smoke mode end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <numeric>
#include <set>

#include "bench/bench_case.h"
#include "bench/cpu_bench.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/step_bytes.h"
#include "common/prepared_tensors.h"
#include "common/random.h"
#include "core/check.h"
#include "model/footprint.h"
#include "model/prepare.h"
#include "model/synthetic.h"

using namespace m3;
using namespace m3::bench;

namespace {

using test::layer_tensors;

}  // namespace

TEST(BenchCase, ParseCounts) {
  EXPECT_EQ(parse_count("8K", "x"), 8192);
  EXPECT_EQ(parse_count("64k", "x"), 65536);
  EXPECT_EQ(parse_count("1M", "x"), 1 << 20);
  EXPECT_EQ(parse_count(" 100 ", "x"), 100);
  EXPECT_EQ(parse_count("0", "x"), 0);
  EXPECT_EQ(parse_count_list("1,2,4", "x"), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(format_count(8192), "8K");
  EXPECT_EQ(format_count(1000), "1000");
  EXPECT_EQ(format_count(1 << 20), "1M");
  for (const char* bad : {"", "K", "8X", "-1", "1.5K", "99999999999", "4096M", "1,,2"}) {
    try {
      if (std::string(bad).find(',') != std::string::npos) parse_count_list(bad, "--context");
      else parse_count(bad, "--context");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--context"), std::string::npos) << e.what();
    }
  }
  auto cases = make_cases({1, 4}, {0, 8192}, {512});
  ASSERT_EQ(cases.size(), 5u);
  EXPECT_EQ(cases[1].batch, 4);
  EXPECT_EQ(cases[2].context, 8192);
  EXPECT_TRUE(cases[4].is_prefill());
  EXPECT_EQ(cases[4].tokens(), 512);
  EXPECT_EQ(cases[3].max_len(), 8193);
  EXPECT_THROW(make_cases({0}, {8}, {}), Error);
  EXPECT_THROW(make_cases({}, {}, {}), Error);
  // verify steps: q tokens a row, after the decode cases of each context
  auto v = make_cases({1, 2}, {1024}, {}, {1, 4});
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[1].label(), "decode b=2 ctx=1K");
  EXPECT_EQ(v[2].label(), "decode b=1 q=4 ctx=1K");
  EXPECT_EQ(v[3].tokens(), 8);
  EXPECT_EQ(v[3].max_len(), 1028);
  EXPECT_THROW(make_cases({1}, {8}, {}, {5}), Error);
  EXPECT_THROW(make_cases({1}, {8}, {}, {0}), Error);
}

TEST(BenchStats, MedianAndNearestRankP90) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<double> v(n);
    std::uniform_real_distribution<double> u(0, 1000);
    for (auto& x : v) x = u(rng);
    Stats s = summarize(v);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    // p90 by its definition: the smallest sample with at least 90% of the samples <= it
    double want = 0;
    for (double x : sorted) {
      size_t le = size_t(std::count_if(v.begin(), v.end(), [&](double y) { return y <= x; }));
      if (10 * le >= 9 * n) {
        want = x;
        break;
      }
    }
    EXPECT_EQ(s.p90, want) << "n " << n;
    // median: half the samples on each side
    size_t below = size_t(std::count_if(v.begin(), v.end(), [&](double y) { return y < s.median; }));
    size_t above = size_t(std::count_if(v.begin(), v.end(), [&](double y) { return y > s.median; }));
    EXPECT_EQ(below, above) << "n " << n;
    EXPECT_EQ(s.min, sorted.front());
    EXPECT_EQ(s.max, sorted.back());
    EXPECT_EQ(s.n, n);
  }
  Stats one = summarize({7.0});
  EXPECT_EQ(one.median, 7.0);
  EXPECT_EQ(one.p90, 7.0);
  EXPECT_THROW(summarize({}), Error);
  EXPECT_THROW(summarize({1.0, NAN}), Error);
}

TEST(BenchBytes, ExpectedDistinctExpertsMatchesMonteCarlo) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(128, 4, 0), 0);
  EXPECT_NEAR(expected_distinct_experts(128, 4, 1), 4, 1e-12);
  EXPECT_NEAR(expected_distinct_experts(128, 4, 100000), 128, 1e-9);
  for (int tokens : {2, 8, 64}) {
    const int E = 128, K = 4, trials = 4000;
    double sum = 0, sum2 = 0;
    std::vector<int> perm(static_cast<size_t>(E));
    for (int t = 0; t < trials; ++t) {
      std::set<int> hit;
      for (int i = 0; i < tokens; ++i) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        hit.insert(perm.begin(), perm.begin() + K);
      }
      sum += double(hit.size());
      sum2 += double(hit.size()) * double(hit.size());
    }
    const double mean = sum / trials, sd = std::sqrt(std::max(0.0, sum2 / trials - mean * mean));
    // 5 standard errors of the Monte Carlo mean (plus a floor for the zero-variance case)
    EXPECT_NEAR(expected_distinct_experts(E, K, tokens), mean, 5 * sd / std::sqrt(double(trials)) + 1e-3)
        << tokens << " tokens";
  }
}

// Sparse K/V tokens by brute force: random block scores, local block forced, top-k kept, count
// the keys j < len that lie in the kept blocks.
TEST(BenchBytes, SparseKvWindowMatchesBruteForceSelection) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = test::small_spec();  // block 4, top-3, 1 local
  const PreparedLayout L = plan_prepared(s);
  StepBytesOptions o;
  const CacheBytes cb = cache_bytes_per_token(L, o);
  for (int64_t ctx = 0; ctx < 60; ++ctx) {
    const int64_t len = ctx + 1, bs = s.index_block, nb = (len + bs - 1) / bs;
    std::vector<std::pair<double, int64_t>> score;
    std::uniform_real_distribution<double> u(0, 1);
    for (int64_t b = 0; b < nb; ++b) score.push_back({b >= nb - s.index_local ? 2.0 : u(rng), b});
    std::sort(score.rbegin(), score.rend());
    int64_t keys = 0;
    for (int64_t i = 0; i < std::min<int64_t>(nb, s.index_topk); ++i)
      keys += std::min(len, (score[size_t(i)].second + 1) * bs) - score[size_t(i)].second * bs;
    for (int batch : {1, 3}) {
      auto ops = step_ops(L, BenchCase{batch, ctx, 0}, o);
      for (const auto& op : ops) {
        if (op.op == "kv" && s.sparse(op.layer))
          EXPECT_DOUBLE_EQ(op.bytes, double(batch) * 2 * double(keys) * cb.kv) << "ctx " << ctx << " layer " << op.layer;
        if (op.op == "kv" && !s.sparse(op.layer))
          EXPECT_DOUBLE_EQ(op.bytes, double(batch) * 2 * double(len) * cb.kv) << "ctx " << ctx;
        if (op.op == "index_k") EXPECT_DOUBLE_EQ(op.bytes, double(batch) * double(len) * cb.ik) << "ctx " << ctx;
      }
    }
  }
}

// With every expert hit, the step's weight bytes are every prepared tensor once, minus the
// embedding rows the step does not gather; the regions cover exactly those bytes, inside the
// arena, never overlapping.
TEST(BenchBytes, WeightsAreEveryTensorOnceAndRegionsMatch) {
  for (const char* preset : {"tiny", "small", "real"}) {
    for (int tp : {1, 4}) {
      ModelSpec s = synthetic_preset(preset);
      if (s.num_kv_heads % tp != 0 || s.index_heads % tp != 0) continue;
      s = shard_spec(s, tp);
      const PreparedLayout L = plan_prepared(s);
      double all = double(L.lm_head.bytes + L.final_norm.bytes);
      for (const auto& Y : L.layers)
        for (const PTensor* t : layer_tensors(Y)) all += double(t->bytes);
      StepBytesOptions o;
      o.experts_hit.assign(size_t(s.num_layers), double(s.num_experts));
      const BenchCase c{3, 40, 0};
      StepBytes b = step_bytes(L, c, o);
      const double embed = 3.0 * double(L.embed.row_bytes);
      EXPECT_DOUBLE_EQ(b.weights, all + embed) << preset << " tp " << tp;
      EXPECT_EQ(b.expert_model, "given");
      EXPECT_DOUBLE_EQ(b.total, b.weights + b.cache);

      auto ops = step_ops(L, c, o, true, 7);
      std::vector<std::pair<int64_t, int64_t>> arena;
      double region_bytes = 0;
      for (const auto& op : ops) {
        double sum = 0;
        for (const auto& r : op.regions) {
          if (r.space == Space::Arena) {
            arena.push_back({r.begin, r.count});
            sum += double(r.count);
          } else {
            const CacheBytes cb = cache_bytes_per_token(L, o);
            sum += double(r.count) * (r.space == Space::IKCache ? cb.ik : cb.kv);
            EXPECT_GE(r.begin, 0);
            EXPECT_LE(r.begin + r.count, c.max_len());
            EXPECT_TRUE(r.row >= 0 && r.row < c.batch);
          }
        }
        EXPECT_DOUBLE_EQ(sum, op.bytes) << preset << " op " << op.op << " layer " << op.layer;
        region_bytes += sum;
      }
      EXPECT_DOUBLE_EQ(region_bytes, b.total);
      std::sort(arena.begin(), arena.end());
      for (size_t i = 0; i < arena.size(); ++i) {
        EXPECT_GE(arena[i].first, 0);
        EXPECT_LE(uint64_t(arena[i].first + arena[i].second), L.total_bytes);
        if (i > 0) EXPECT_LE(arena[i - 1].first + arena[i - 1].second, arena[i].first) << preset << " overlap";
      }
    }
  }
}

// The expected-random model at batch 1 reads top_k experts: per-token weight bytes agree with
// footprint.h (same formats, same sharding) up to row padding and the one-row embedding.
TEST(BenchBytes, AgreesWithFootprint) {
  for (int tp : {1, 4}) {
    ModelSpec real = synthetic_preset("real");
    const PreparedLayout L = plan_prepared(shard_spec(real, tp));
    FootprintOptions fo;
    fo.tp = tp;
    Footprint fp = compute_footprint(real, fo);
    StepBytes b = step_bytes(L, BenchCase{1, 8192, 0}, {});
    EXPECT_NEAR(b.experts_hit_mean, 4.0, 1e-12);
    EXPECT_NEAR(b.weights / fp.weight_bytes_per_token, 1.0, 0.01) << "tp " << tp << ": " << b.weights << " vs "
                                                                   << fp.weight_bytes_per_token;
    // index-K: the whole cache of every sparse layer (context + the new token)
    EXPECT_DOUBLE_EQ(b.index_k, double(real.num_sparse_layers()) * 8193 * real.index_dim);
  }
}

// `m3mono info --tp N` prints compute_footprint's per-rank weight bytes: they must be what one
// rank's prepared arena holds (plan_prepared at tp_size N), at tp 1 and where K/V heads are split
// (2, 4) or replicated (8 ranks over M3's 4 KV heads). The arena aligns each tensor, so the two
// may differ by that padding only (well under 0.1%).
TEST(Footprint, PerRankBytesMatchThePreparedArena) {
  const ModelSpec real = synthetic_preset("real");
  for (int tp : {1, 2, 4, 8}) {
    PrepareOptions po;
    po.tp_size = tp;
    const PreparedLayout L = plan_prepared(real, po);
    FootprintOptions fo;
    fo.tp = tp;
    const Footprint fp = compute_footprint(real, fo);
    EXPECT_NEAR(double(L.total_bytes) / fp.weight_bytes, 1.0, 1e-3)
        << "tp " << tp << ": arena " << L.total_bytes << " B, footprint " << fp.weight_bytes << " B\n"
        << L.describe_bytes();
    // the K/V cache per token: this rank's KV heads (replicated past 4 ranks)
    EXPECT_DOUBLE_EQ(fp.kv_bytes_per_token, double(real.num_layers) * 2 * L.kv_heads * real.head_dim * fo.kv_bytes)
        << "tp " << tp;
  }
}

TEST(BenchCase, ShardAndLayerCut) {
  ModelSpec real = synthetic_preset("real");
  ModelSpec r4 = shard_spec(real, 4);
  EXPECT_EQ(r4.num_heads, 16);
  EXPECT_EQ(r4.num_kv_heads, 1);
  EXPECT_EQ(r4.index_heads, 1);
  EXPECT_EQ(r4.moe_inter, 768);
  EXPECT_EQ(r4.shared_inter, 768);
  EXPECT_EQ(r4.dense_inter, 3072);
  EXPECT_EQ(r4.vocab_size, 50016);
  EXPECT_EQ(r4.index_dim, real.index_dim);
  // the shard at tp 1 lays out the same per-rank tensors as the model at tp_size 4
  PrepareOptions p4;
  p4.tp_size = 4;
  const PreparedLayout a = plan_prepared(r4), b = plan_prepared(real, p4);
  for (size_t f = 0; f < a.family_bytes.size(); ++f)
    if (PreparedFamily(f) != PreparedFamily::Embed) EXPECT_EQ(a.family_bytes[f], b.family_bytes[f]) << f;
  EXPECT_EQ(a.layers[5].qkv.codes.rows, b.layers[5].qkv.codes.rows);
  try {
    shard_spec(real, 3);
    ADD_FAILURE() << "tp-shard 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
  // tp 8 over 4 KV heads: each rank the one KV (and index) head its 8 query heads use, replicated
  const ModelSpec r8 = shard_spec(real, 8);
  EXPECT_EQ(r8.num_heads, 8);
  EXPECT_EQ(r8.num_kv_heads, 1);
  EXPECT_EQ(r8.index_heads, 1);
  EXPECT_THROW(shard_spec(real, 128), Error);  // 64 query heads
  ModelSpec one = last_layers(real, 1);
  EXPECT_EQ(one.num_layers, 1);
  EXPECT_TRUE(one.sparse(0) && one.moe(0));
  ModelSpec all = last_layers(real, 60);
  EXPECT_EQ(all, real);
  EXPECT_FALSE(last_layers(real, 58).sparse(0));
  EXPECT_THROW(last_layers(real, 0), Error);
  EXPECT_THROW(last_layers(real, 61), Error);
}

TEST(BenchReport, JsonHasEveryFigureAndNullForUnmeasured) {
  BenchReport r;
  r.mode = "cuda";
  r.copy_GBps = 4000;
  r.read_GBps = NAN;
  r.boundary_us = 0.8;
  CaseResult c;
  c.c = BenchCase{2, 1024, 0};
  c.bytes.total = 4e6;
  c.floor_us = 1.0;
  PathResult p;
  p.path = "stream";
  p.us = summarize({2.0, 3.0, 4.0});
  p.gap_us = NAN;
  p.ops.push_back(OpTiming{"qkv", 1, 1e6, 0.25, 1.0, NAN, 1});
  c.paths.push_back(p);
  p.path = "native";
  p.us = summarize({6.0});
  c.paths.push_back(p);
  r.cases.push_back(c);
  r.kernels.push_back(KernelResult{"fp8_gemv", "2560x6144", 1, 1.6e7, 5.0, 4.0, NAN, "", 0});
  auto j = report_json(r);
  EXPECT_EQ(j["schema"], "m3mono-bench/1");
  EXPECT_TRUE(j["bandwidth"]["read_GBps"].is_null());
  EXPECT_EQ(j["bandwidth"]["boundary_us"], 0.8);
  const auto& jc = j["cases"][0];
  EXPECT_EQ(jc["batch"], 2);
  EXPECT_EQ(jc["context"], 1024);
  EXPECT_EQ(jc["paths"][0]["median_us"], 3.0);
  EXPECT_EQ(jc["paths"][0]["p90_us"], 4.0);
  EXPECT_DOUBLE_EQ(jc["paths"][0]["achieved_fraction"].get<double>(), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(jc["paths"][1]["ratio_to_first"].get<double>(), 2.0);
  EXPECT_TRUE(jc["paths"][0]["ops"][0]["read_us"].is_null());
  EXPECT_TRUE(jc["paths"][0]["gap_us"].is_null());
  EXPECT_TRUE(j["kernels"][0]["cublas_us"].is_null());
  EXPECT_DOUBLE_EQ(j["kernels"][0]["read_fraction"].get<double>(), 0.8);
  std::FILE* f = std::tmpfile();
  print_report(r, f);  // must not throw on NaN fields
  std::fclose(f);
}

// End to end through the reference engine: every case gets finite statistics over the asked
// number of steps, a positive floor and the op list of the accounting.
TEST(BenchCpu, SmokeModeRunsEveryCase) {
  BenchOptions o;
  o.device = "cpu";
  o.preset = "tiny";
  o.layers = 2;
  o.batches = {1, 3};
  o.contexts = {0, 21};
  o.prefills = {17};
  o.steps = 3;
  o.warmup = 1;
  o.threads = 2;
  BenchReport r = run_cpu_bench(o);
  ASSERT_EQ(r.cases.size(), 5u);
  EXPECT_GT(r.copy_GBps, 0);
  EXPECT_EQ(r.layers, 2);
  for (const auto& c : r.cases) {
    ASSERT_EQ(c.paths.size(), 1u);
    const auto& p = c.paths[0];
    EXPECT_EQ(p.path, "cpu-ref");
    EXPECT_EQ(p.us.n, 3u);
    EXPECT_TRUE(std::isfinite(p.us.median) && p.us.median > 0);
    EXPECT_GE(p.us.p90, p.us.median);
    EXPECT_GT(c.floor_us, 0);
    EXPECT_GT(c.bytes.flops, 0);
    double sum = 0;
    for (const auto& op : p.ops) sum += op.bytes;
    EXPECT_DOUBLE_EQ(sum, c.bytes.total);
  }
  o.paths = {"native"};
  EXPECT_THROW(run_cpu_bench(o), Error);
  o.paths = {};
  o.preset = "real";
  EXPECT_THROW(run_cpu_bench(o), Error);  // refused before any allocation
}
