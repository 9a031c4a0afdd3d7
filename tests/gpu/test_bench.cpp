// The benchmark harness on the device (bench/cuda/): random fills in the prepared formats (no
// FP8 NaN codes, E8M0 and value ranges kept, row padding untouched), the "stream" path reads
// exactly the bytes of the step accounting with one launch per op, per-op spans line up with the
// ops, graph timing returns finite statistics over the asked replays, and the "native" path
// (CudaBackend on the bench's arena and cache) runs decode and prefill with finite logits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "bench/cuda/device_weights.h"
#include "bench/cuda/graph_timer.h"
#include "bench/cuda/probes.h"
#include "bench/cuda/step_runner.h"
#include "core/codecs.h"
#include "model/synthetic.h"
#include "native/cuda_backend.h"
#include "native/forward.h"
#include "native/mma_rope.h"
#include "native/cuda_check.h"
#include "native/prepared.h"

using namespace m3;
using namespace m3::bench;

namespace {
uint64_t seed_once() {
  static const uint64_t s = std::random_device{}();
  return s;
}
}  // namespace

TEST(BenchHarness, RandomFillsKeepFormatsAndPadding) {
  const uint64_t seed = seed_once();
  SCOPED_TRACE("seed " + std::to_string(seed));
  CudaStream cs;
  const int64_t rows = 37, row_bytes = 48, used = 40;
  void* p = nullptr;
  M3_CUDA_CHECK(cudaMalloc(&p, size_t(rows * row_bytes)));
  std::vector<uint8_t> h(size_t(rows * row_bytes));
  struct Case {
    FillFormat f;
    float lo, hi;
  };
  for (Case c : {Case{FillFormat::Fp8, 0, 0}, Case{FillFormat::E8M0, 118, 121}, Case{FillFormat::Bf16, -0.5f, 0.25f},
                 Case{FillFormat::F32, 1e-3f, 2e-3f}, Case{FillFormat::Bytes, 0, 0}}) {
    M3_CUDA_CHECK(cudaMemset(p, 0xAB, size_t(rows * row_bytes)));  // poison: padding must keep it
    fill_random(p, rows, row_bytes, used, c.f, c.lo, c.hi, seed, cs.s);
    M3_CUDA_CHECK(cudaStreamSynchronize(cs.s));
    M3_CUDA_CHECK(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost));
    int distinct = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < row_bytes; ++b) {
        const uint8_t v = h[size_t(r * row_bytes + b)];
        if (b >= used) {
          ASSERT_EQ(v, 0xAB) << "padding written at row " << r << " byte " << b;
          continue;
        }
        distinct += v != h[0];
        if (c.f == FillFormat::Fp8) {
          ASSERT_NE(v & 0x7f, 0x7f) << "E4M3 NaN code at row " << r << " byte " << b;
        }
        if (c.f == FillFormat::E8M0) {
          ASSERT_TRUE(v >= 118 && v <= 121) << int(v);
        }
      }
    EXPECT_GT(distinct, 0) << "fill " << int(c.f) << " wrote one constant";
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < used; b += (c.f == FillFormat::Bf16 ? 2 : c.f == FillFormat::F32 ? 4 : used)) {
        const uint8_t* q = h.data() + r * row_bytes + b;
        if (c.f == FillFormat::Bf16) {
          uint16_t bits;
          std::memcpy(&bits, q, 2);
          float v = bf16_to_f32(bits);
          ASSERT_TRUE(v >= -0.5f && v <= 0.25f) << v;
        }
        if (c.f == FillFormat::F32) {
          float v;
          std::memcpy(&v, q, 4);
          ASSERT_TRUE(v >= 1e-3f && v <= 2e-3f) << v;
        }
      }
  }
  cudaFree(p);
}

// The stream path on a real-heads shard: its bytes are the accounting's (batch 1: exactly top_k
// experts), one launch per op, per-op spans in op order.
TEST(BenchHarness, StreamPathReadsTheAccountedBytes) {
  const uint64_t seed = seed_once();
  CudaStream cs;
  const ModelSpec spec = shard_spec(synthetic_preset("real-heads"), 2);
  const PreparedLayout L = plan_prepared(spec);
  DeviceArena arena(L, seed, cs.s);
  for (BenchCase c : {BenchCase{1, 300, 0}, BenchCase{3, 2500, 0}, BenchCase{1, 0, 700}}) {
    SCOPED_TRACE(c.label());
    const int64_t blocks = int64_t(c.is_prefill() ? 1 : c.batch) * blocks_per_row(c, spec.index_block);
    native::DeviceKvCache cache(native::kv_cache_shape(spec, int(blocks)));
    fill_cache_random(cache, seed, cs.s);
    StepEnv env;
    env.spec = &spec;
    env.layout = &L;
    env.arena = arena.base();
    env.cache = &cache;
    env.seed = seed;
    auto run = make_stream_runner(env);
    run->setup(c, cs.s);
    StepBytesOptions bo;
    std::vector<StepOp> ops = step_ops(L, c, bo);
    if (c.tokens() == 1) {
      EXPECT_DOUBLE_EQ(run->path_bytes(), step_bytes(L, c, bo).total);
    }
    GraphTiming t = time_graph([&](cudaStream_t st) { run->enqueue(st, nullptr); }, cs.s, 2, 12);
    EXPECT_EQ(t.us.n, 12u);
    EXPECT_TRUE(std::isfinite(t.us.median) && t.us.median > 0);
    EXPECT_EQ(t.kernels, int(ops.size()));
    auto spans = time_ops([&](cudaStream_t st, OpRecorder* rec) { run->enqueue(st, rec); }, cs.s, 3);
    ASSERT_EQ(spans.size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(spans[i].op, ops[i].op);
      EXPECT_EQ(spans[i].layer, ops[i].layer);
      EXPECT_EQ(spans[i].launches, 1) << ops[i].op;
      EXPECT_TRUE(std::isfinite(spans[i].us) && spans[i].us >= 0);
    }
  }
}

// The "native" path (CudaBackend over the bench's own random arena and cache): decode steps at a
// context whose history was never prefilled (declared written), captured and replayed by the
// harness; the prefill eager; per-op marks in forward order; the router's actual choices as
// experts hit; finite logits after the timed steps. Two shapes: one TP-4 rank of the real model
// cut to its last 2 layers (what `m3mono bench --tp-shard 4 --layers 2` runs), and a TP-2 rank of
// real-heads (its dense full-attention first layer included).
TEST(BenchHarness, NativePathRunsOnTheBenchArenaWithFiniteLogits) {
  const uint64_t seed = seed_once();
  SCOPED_TRACE("seed " + std::to_string(seed));
  register_builtin_paths();
  CudaStream cs;
  const std::vector<std::string> known = {"embed", "norms", "qkv",    "rope_cache", "index_k", "kv",
                                          "o",     "moe",   "dense_mlp", "lm_head"};
  for (const ModelSpec& spec : {last_layers(shard_spec(synthetic_preset("real"), 4), 2),
                                shard_spec(synthetic_preset("real-heads"), 2)}) {
    SCOPED_TRACE("hidden " + std::to_string(spec.hidden) + ", " + std::to_string(spec.num_layers) + " layers");
    const PreparedLayout L = plan_prepared(spec);
    DeviceArena arena(L, seed, cs.s);
    const std::vector<BenchCase> cases = {BenchCase{1, 300, 0}, BenchCase{3, 2500, 0}, BenchCase{1, 0, 700}};
    StepEnv env;
    int64_t blocks = 1;
    for (const auto& c : cases) {
      blocks = std::max<int64_t>(blocks, int64_t(c.is_prefill() ? 1 : c.batch) * blocks_per_row(c, spec.index_block));
      env.max_len = std::max(env.max_len, c.max_len());
      if (c.is_prefill()) env.max_prefill = std::max(env.max_prefill, c.prefill);
      else env.max_batch = std::max(env.max_batch, c.batch);
    }
    native::DeviceKvCache cache(native::kv_cache_shape(spec, int(blocks)));
    fill_cache_random(cache, seed, cs.s);
    env.spec = &spec;
    env.layout = &L;
    env.arena = arena.base();
    env.weights = arena.prepared();
    env.cache = &cache;
    env.seed = seed;
    EXPECT_EQ(env.weights->device_base(), arena.base()) << "the arena must be the only weight allocation";
    auto run = step_path("native")(env);
    EXPECT_EQ(run->name(), "native");
    for (const BenchCase& c : cases) {
      SCOPED_TRACE(c.label());
      run->setup(c, cs.s);
      EXPECT_EQ(run->capturable(), !c.is_prefill());
      std::vector<OpSpan> spans;
      if (run->capturable()) {
        GraphTiming t = time_graph([&](cudaStream_t st) { run->enqueue(st, nullptr); }, cs.s, 1, 5);
        EXPECT_EQ(t.us.n, 5u);
        EXPECT_TRUE(std::isfinite(t.us.median) && t.us.median > 0);
        EXPECT_GT(t.kernels, 4 * spec.num_layers);
        spans = time_ops([&](cudaStream_t st, OpRecorder* rec) { run->enqueue(st, rec); }, cs.s, 2);
      } else {
        EagerTiming et = time_eager([&](cudaStream_t s, OpRecorder* rec) { run->run_eager(s, rec); }, cs.s, 2);
        EXPECT_EQ(et.us.n, 2u);
        EXPECT_TRUE(std::isfinite(et.us.median) && et.us.median > 0);
        spans = et.spans;
      }
      // embed, then per layer qkv, rope_cache (decode: inside qkv's op, kernels/mma_rope.cuh), (index_k),
      // kv, o, moe | dense_mlp, each once in this order; lm_head. The norms between them are spans where they are ops of their own: every
      // one at prefill, at decode only those the plan does not fuse into the op before them (layer
      // 0's input norm after the embedding; kernels/fused_norm_params.h)
      std::vector<std::string> want = {"embed@-1"}, got;
      for (int l = 0; l < spec.num_layers; ++l) {
        for (const char* op : {"qkv", "rope_cache", "index_k", "kv", "o"})
          if ((std::string(op) != "index_k" || spec.sparse(l)) &&
              (std::string(op) != "rope_cache" || c.is_prefill() || !native::mma_rope_enabled() ||
               !native::split_activations_enabled()))
            want.push_back(fmt::format("{}@{}", op, l));
        want.push_back(fmt::format("{}@{}", spec.moe(l) ? "moe" : "dense_mlp", l));
      }
      want.push_back("lm_head@-1");
      std::string listed;
      int norms = 0;
      for (const auto& sp : spans) {
        listed += " " + sp.op + "@" + std::to_string(sp.layer);
        if (sp.op == "norms") ++norms;
        else got.push_back(sp.op + "@" + std::to_string(sp.layer));
      }
      EXPECT_EQ(got, want) << "spans:" << listed;
      EXPECT_GE(norms, 1) << "spans:" << listed;  // layer 0's input norm at least
      EXPECT_LE(norms, 2 * spec.num_layers) << "spans:" << listed;
      if (c.is_prefill()) {
        EXPECT_EQ(norms, 2 * spec.num_layers) << "spans:" << listed;
      }
      EXPECT_EQ(spans.front().op, "embed");
      EXPECT_EQ(spans.back().op, "lm_head");
      for (const auto& sp : spans) {
        EXPECT_NE(std::find(known.begin(), known.end(), sp.op), known.end()) << sp.op;
        EXPECT_TRUE(std::isfinite(sp.us) && sp.us >= 0) << sp.op;
        if (run->capturable()) {
          EXPECT_GE(sp.launches, 1) << sp.op << " layer " << sp.layer;
        }
      }
      EXPECT_EQ(run->check_outputs(), "");
      const std::vector<double> hit = run->experts_hit();
      ASSERT_EQ(hit.size(), size_t(spec.num_layers));
      for (int l = 0; l < spec.num_layers; ++l) {
        if (!spec.moe(l)) continue;
        // top_k distinct experts per token: exactly top_k for one token, at most tokens x top_k
        if (c.tokens() == 1) {
          EXPECT_EQ(hit[size_t(l)], spec.top_k) << "layer " << l;
        }
        EXPECT_GE(hit[size_t(l)], spec.top_k) << "layer " << l;
        EXPECT_LE(hit[size_t(l)], std::min<double>(spec.num_experts, double(c.tokens()) * spec.top_k)) << "layer " << l;
      }
    }
  }
}

// The bench's native path runs what CudaBackend runs: the decode-bucket plan of native::Forward
// over the same weights and cache gives bitwise the backend's logits of the same decode step (after
// the backend's prefill wrote the history). The backend refuses a decode step over history nobody
// wrote, and a borrowed cache of another shape.
TEST(BenchHarness, ForwardBucketPlanEqualsTheBackendStep) {
  const uint64_t seed = seed_once();
  CudaStream cs;
  const ModelSpec spec = shard_spec(synthetic_preset("real-heads"), 2);
  DeviceArena arena(plan_prepared(spec), seed, cs.s);
  native::DeviceKvCache cache(native::kv_cache_shape(spec, 8));
  fill_cache_random(cache, seed, cs.s);
  native::CudaBackendOptions o;
  o.cuda_graphs = false;
  o.max_graph_batch = 2;
  o.max_tokens = 256;
  auto be = native::make_cuda_backend(arena.prepared(), o, &cache);
  EXPECT_EQ(be->num_cache_blocks(), 8);
  StepBatch b;
  b.seqs.push_back(SeqStep{200, {5}, {3, 4}, false});
  EXPECT_THROW(be->step(b), Error);  // positions [0, 200) never written
  StepBatch pre;
  pre.seqs.push_back(SeqStep{0, std::vector<int32_t>(200), {3, 4}, false});
  for (int t = 0; t < 200; ++t) pre.seqs[0].tokens[size_t(t)] = int32_t((t * 37 + 11) % spec.vocab_size);
  be->step(pre);
  const StepOutput out = be->step(b);
  ASSERT_EQ(out.logits.size(), size_t(spec.vocab_size));

  native::ForwardOptions fo;
  fo.max_tokens = o.max_tokens;
  fo.max_model_len = be->options().max_model_len;
  fo.logits_rows = be->options().logits_rows;
  native::Forward fw(arena.prepared(), cache, fo);
  const std::vector<int32_t> table{3, 4};
  native::StepMetadata m =
      native::build_step_metadata(std::vector<native::SeqRows>{native::SeqRows{200, 1, table}}, spec.index_block, 8, 1);
  std::vector<int32_t> t(size_t(fw.table_width()), -1);
  std::copy(m.block_tables.begin(), m.block_tables.end(), t.begin());
  m.block_tables = t;
  m.table_width = fw.table_width();
  fw.upload(m, std::vector<int32_t>{5}, cs.s);
  M3_CUDA_CHECK(cudaMemsetAsync(fw.act().logits.get(), 0xff, fw.act().logits.bytes(), cs.s));  // NaN poison
  fw.run(fw.bucket_plan(1), cs.s);
  M3_CUDA_CHECK(cudaStreamSynchronize(cs.s));
  std::vector<float> logits(size_t(spec.vocab_size));
  M3_CUDA_CHECK(cudaMemcpy(logits.data(), fw.act().logits.get(), logits.size() * 4, cudaMemcpyDeviceToHost));
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::memcmp(&out.logits[i], &logits[i], 4) != 0) first = differ++ ? first : i;
  EXPECT_EQ(differ, 0u) << "first at " << first << ": backend " << out.logits[first] << " vs forward " << logits[first];
  native::DeviceKvCache other(native::kv_cache_shape(spec, 8, DType::BF16));
  EXPECT_THROW(native::make_cuda_backend(arena.prepared(), o, &other), Error);  // kv dtype differs
}
