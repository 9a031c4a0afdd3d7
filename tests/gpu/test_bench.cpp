// The benchmark harness on the device (bench/cuda/): random fills in the prepared formats (no
// FP8 NaN codes, E8M0 and value ranges kept, row padding untouched), the "stream" path reads
// exactly the bytes of the step accounting with one launch per op, per-op spans line up with the
// ops, and graph timing returns finite statistics over the asked replays.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "bench/cuda/device_weights.h"
#include "bench/cuda/graph_timer.h"
#include "bench/cuda/probes.h"
#include "bench/cuda/step_runner.h"
#include "core/codecs.h"
#include "model/synthetic.h"
#include "native/cuda_check.h"

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
        if (c.f == FillFormat::Fp8) ASSERT_NE(v & 0x7f, 0x7f) << "E4M3 NaN code at row " << r << " byte " << b;
        if (c.f == FillFormat::E8M0) ASSERT_TRUE(v >= 118 && v <= 121) << int(v);
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
    if (c.tokens() == 1) EXPECT_DOUBLE_EQ(run->path_bytes(), step_bytes(L, c, bo).total);
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
