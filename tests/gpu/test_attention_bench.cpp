// Decode timing of the indexer and the block-sparse attention at batch 1 (real MiniMax-M3 layer
// shapes: 64 q heads, 4 KV heads, head_dim 128, index 4 x 128, block 128, top-16, FP8 caches),
// contexts 8K and 64K, against the bytes each must read: the whole index-K cache (context x 128 B)
// and the selected K/V blocks (4 groups x 16 blocks x 128 tokens x 128 B x 2). Cold L2 (a 256 MB
// memset between iterations) and warm, iterations enqueued back to back, medians of event
// timings; plus a CUDA-graph replay of 20 layers' worth (warm). Runs only with M3_BENCH=1.
//
// Measured on an H200 (2026-11-30, SM 1980 MHz, D2D copy 4.2 TB/s), auto split (32), per layer:
//   ctx 8K : indexer 13.1 us + attention 20.6 us = 34.0 us cold, 24.3 us in a graph (3.15 MB)
//   ctx 64K: indexer 21.3 us + attention 21.1 us = 42.2 us cold, 31.3 us in a graph (10.5 MB)
//   dense (full layers, no indexer): 8K 41 us (8.4 MB), 64K 153 us (67 MB, CUDA-core bound)
// ncu at 64K: block scores 10.1 us (8.4 MB), top-k 8.9 us, attention split 12.7 us (2.2 MB),
// combine 8.8 us. The byte floor at 4.2 TB/s is 0.75 / 2.5 us: these kernels are latency-bound
// (dependent global reads per thread block, four small launches), not bandwidth-bound.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "native/attention.h"
#include "native/indexer.h"
#include "test_attention_common.h"

using namespace m3;
using namespace m3::test;
using namespace m3::test::cache_tests;

namespace {

std::vector<uint8_t> random_fp8(size_t n, uint64_t seed) {
  std::vector<uint8_t> b(n);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    for (size_t j = 0; j < 8 && i + j < n; ++j) {
      uint8_t v = uint8_t(x >> (8 * j));
      if ((v & 0x7f) == 0x7f) v ^= 1;  // no NaN codes
      b[i + j] = v;
    }
  }
  return b;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

TEST(GpuAttentionBench, DecodeBatch1) {
  if (!std::getenv("M3_BENCH")) GTEST_SKIP() << "set M3_BENCH=1 to run the decode timing";
  const int H = 64, KV = 4, D = 128, IH = 4, ID = 128, bs = 128, topk = 16;
  cudaStream_t st;
  M3_CUDA_CHECK(cudaStreamCreate(&st));
  DevBuf<uint8_t> flush(size_t(256) << 20);
  cudaEvent_t e0, e1, e2;
  M3_CUDA_CHECK(cudaEventCreate(&e0));
  M3_CUDA_CHECK(cudaEventCreate(&e1));
  M3_CUDA_CHECK(cudaEventCreate(&e2));
  std::vector<cudaEvent_t> ev(180);
  for (auto& e : ev) M3_CUDA_CHECK(cudaEventCreate(&e));
  // Reference bandwidth: 1 GiB device-to-device copy (read + write counted).
  float copy_tbs = 0;
  {
    DevBuf<uint8_t> a(size_t(1) << 30), b(size_t(1) << 30);
    M3_CUDA_CHECK(cudaMemsetAsync(a.p, 1, a.n, st));
    std::vector<float> ts;
    for (int i = 0; i < 6; ++i) {
      M3_CUDA_CHECK(cudaEventRecord(e0, st));
      M3_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, a.n, cudaMemcpyDeviceToDevice, st));
      M3_CUDA_CHECK(cudaEventRecord(e1, st));
      M3_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms;
      M3_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i) ts.push_back(ms);
    }
    copy_tbs = float(2.0 * double(a.n) / (median(ts) * 1e-3) / 1e12);
  }
  std::printf("\n  device-to-device copy 1 GiB: %.2f TB/s (read + write)\n", copy_tbs);
  std::printf("  %-6s %-5s %-6s %9s %9s %9s %10s %10s %8s\n", "ctx", "L2", "splits", "index_us", "attn_us",
              "total_us", "bytes_MB", "GB/s", "of_copy");
  // M3_BENCH_CTX=<n> times one context; M3_BENCH_ITERS=<n> sets the iteration count and keeps
  // only the automatic split and no graph (for a profiler run).
  const char* ctx_env = std::getenv("M3_BENCH_CTX");
  const char* it_env = std::getenv("M3_BENCH_ITERS");
  std::vector<int> ctxs = ctx_env ? std::vector<int>{std::atoi(ctx_env)} : std::vector<int>{8192, 65536};
  const bool short_run = it_env != nullptr;
  const int kIters = short_run ? std::max(1, std::atoi(it_env)) : 60, kWarm = short_run ? 0 : 10;
  std::vector<int> splits = short_run ? std::vector<int>{0, -1} : std::vector<int>{0, 8, 16, 32, 64, -1};
  Rng rng;
  for (int ctx : ctxs) {
    Scenario sc = make_scenario({{ctx - 1, 1}}, bs, 0, rng.gen, 1);
    native::KvCacheShape shape;
    shape.num_layers = 1;
    shape.num_blocks = sc.num_blocks;
    shape.block_size = bs;
    shape.kv_heads = KV;
    shape.head_dim = D;
    shape.index_dim = ID;
    shape.has_index = {1};
    native::DeviceKvCache cache(shape);
    cache.set_scales(0, 0.01f, 0.01f, 0.02f);
    auto view = cache.layer(0);
    {
      auto k = random_fp8(shape.kv_bytes(), rng.gen());
      M3_CUDA_CHECK(cudaMemcpy(view.k, k.data(), k.size(), cudaMemcpyHostToDevice));
      auto v = random_fp8(shape.kv_bytes(), rng.gen());
      M3_CUDA_CHECK(cudaMemcpy(view.v, v.data(), v.size(), cudaMemcpyHostToDevice));
      auto ik = random_fp8(shape.ik_bytes(), rng.gen());
      M3_CUDA_CHECK(cudaMemcpy(view.ik, ik.data(), ik.size(), cudaMemcpyHostToDevice));
    }
    native::DeviceStepMetadata dmeta(1, 1, sc.meta.table_width);
    dmeta.upload(sc.meta, st);
    DevBuf<float> q(rng.normals(size_t(H) * D)), iq(rng.normals(size_t(IH) * ID)), out(size_t(H) * D);
    size_t iws = native::indexer_workspace_bytes(1, IH, ctx, bs);
    DevBuf<uint8_t> iwork(iws);
    DevBuf<int32_t> sel(size_t(IH) * topk);
    size_t aws = native::attention_workspace_bytes(1, H, KV, D, 256);  // at most 256 chunks per row (below)
    DevBuf<uint8_t> awork(aws);
    native::IndexerArgs ia;
    ia.iq = iq.p;
    ia.index_heads = IH;
    ia.index_dim = ID;
    ia.topk = topk;
    ia.local = 1;
    ia.workspace = iwork.p;
    ia.workspace_bytes = iws;
    ia.selected = sel.p;
    // split -1: dense causal attention over the whole context (the full-attention layers), no indexer.
    for (int split : splits) {
      const bool dense = split < 0;
      const double bytes = dense ? double(ctx) * KV * D * 2 : double(ctx) * ID + double(KV) * topk * bs * D * 2;
      native::AttentionArgs aa;
      aa.q = q.p;
      aa.num_heads = H;
      aa.selected = dense ? nullptr : sel.p;
      aa.topk = dense ? 0 : topk;
      if (dense) split = 0;
      aa.num_splits = split;
      {  // chunks of at least 4 tiles, at most 256 per row (as the backend picks them)
        const int tiles = native::attention_max_tiles(!dense, topk, bs, ctx);
        aa.tiles_per_chunk = std::max(native::kDefaultTilesPerChunk, (tiles + 255) / 256);
      }
      aa.workspace = awork.p;
      aa.workspace_bytes = aws;
      aa.out = out.p;
      // Events around each phase, iterations enqueued back to back (no host sync inside the
      // timed stream, so neither host launch gaps nor an idle GPU between iterations count).
      for (bool cold : {true, false}) {
        int used = 0;
        for (int it = 0; it < kIters; ++it) {
          if (cold) M3_CUDA_CHECK(cudaMemsetAsync(flush.p, it & 0xff, flush.n, st));
          M3_CUDA_CHECK(cudaEventRecord(ev[size_t(3 * it)], st));
          if (!dense) native::indexer_select(ia, dmeta.view(), view, st);
          M3_CUDA_CHECK(cudaEventRecord(ev[size_t(3 * it + 1)], st));
          used = native::attention_forward(aa, dmeta.view(), view, st);
          M3_CUDA_CHECK(cudaEventRecord(ev[size_t(3 * it + 2)], st));
        }
        M3_CUDA_CHECK(cudaStreamSynchronize(st));
        std::vector<float> ti, ta, tt;
        for (int it = kWarm; it < kIters; ++it) {
          float a, b, c;
          M3_CUDA_CHECK(cudaEventElapsedTime(&a, ev[size_t(3 * it)], ev[size_t(3 * it + 1)]));
          M3_CUDA_CHECK(cudaEventElapsedTime(&b, ev[size_t(3 * it + 1)], ev[size_t(3 * it + 2)]));
          M3_CUDA_CHECK(cudaEventElapsedTime(&c, ev[size_t(3 * it)], ev[size_t(3 * it + 2)]));
          ti.push_back(a * 1e3f);
          ta.push_back(b * 1e3f);
          tt.push_back(c * 1e3f);
        }
        float total = median(tt);
        double gbs = bytes / (double(total) * 1e-6) / 1e9;
        std::printf("  %-6d %-5s %-6s %9.2f %9.2f %9.2f %10.2f %10.1f %7.1f%%\n", ctx, cold ? "cold" : "warm",
                    ((dense ? "D" : "") + std::to_string(used)).c_str(), median(ti), median(ta), total, bytes / 1e6,
                    gbs, 100.0 * gbs / (copy_tbs * 1e3));
      }
      // CUDA graph of 20 back-to-back layers' worth (warm L2), replayed: per-layer time with the
      // graph's kernel boundaries, as a captured decode step would run.
      if (!short_run) {
        const int kPer = 20, kReps = 5;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        M3_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        int used = 0;
        for (int i = 0; i < kPer; ++i) {
          if (!dense) native::indexer_select(ia, dmeta.view(), view, st);
          used = native::attention_forward(aa, dmeta.view(), view, st);
        }
        M3_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        M3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        M3_CUDA_CHECK(cudaGraphLaunch(exec, st));
        M3_CUDA_CHECK(cudaEventRecord(ev[0], st));
        for (int r = 0; r < kReps; ++r) M3_CUDA_CHECK(cudaGraphLaunch(exec, st));
        M3_CUDA_CHECK(cudaEventRecord(ev[1], st));
        M3_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        float ms;
        M3_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        float per = ms * 1e3f / float(kPer * kReps);
        double gbs = bytes / (double(per) * 1e-6) / 1e9;
        std::printf("  %-6d %-5s %-6s %9s %9s %9.2f %10.2f %10.1f %7.1f%%\n", ctx, "graph",
                    ((dense ? "D" : "") + std::to_string(used)).c_str(), "-", "-", per, bytes / 1e6, gbs,
                    100.0 * gbs / (copy_tbs * 1e3));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
    }
    // Selections must be valid: ascending ids <= the query block, local block present.
    auto s = sel.download();
    for (int g = 0; g < IH; ++g) {
      EXPECT_EQ(s[size_t(g) * topk + topk - 1], (ctx - 1) / bs) << "local block last (ascending)";
      for (int i = 1; i < topk; ++i) EXPECT_LT(s[size_t(g) * topk + i - 1], s[size_t(g) * topk + i]);
    }
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  cudaStreamDestroy(st);
}
