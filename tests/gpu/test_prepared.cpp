// The device weight arena (native/prepared.h): filled through the pinned staging window it holds
// exactly the bytes the host fill produces (from in-memory weights and from a checkpoint on disk,
// tensor-parallel ranks too); it is the only device allocation the load leaves behind
// (cudaMemGetInfo before/after); its views drive the kernels end to end (fused QKV projection, MoE
// layer) against the CPU reference on the dequantized arena.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/prepared_tensors.h"
#include "core/parallel.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight_table.h"
#include "native/prepared.h"
#include "ref/linear.h"
#include "ref/moe.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

std::vector<uint8_t> device_bytes(const native::PreparedWeights& pw) {
  std::vector<uint8_t> b(pw.device_bytes());
  pw.reader()(0, b.size(), b.data());
  return b;
}

// Compares every tensor byte (alignment gaps are never written and not compared).
void expect_same_tensors(const PreparedLayout& L, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  const std::vector<const PTensor*> ts = test::prepared_tensors(L);
  size_t diff = 0, first = 0;
  for (const PTensor* t : ts)
    for (uint64_t i = t->offset; i < t->offset + t->bytes; ++i)
      if (a[i] != b[i] && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0u) << "first differing arena byte " << first;
}

}  // namespace

TEST(GpuPrepared, DeviceArenaIsTheHostFillAndTheOnlyAllocation) {
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = gpu_test_seed();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  ModelWeights w = synthetic_weights(spec, so);
  auto src = make_weight_source(w);
  M3_CUDA_CHECK(cudaFree(nullptr));
  native::PrepareLoadOptions lo;
  lo.progress = false;
  lo.staging_bytes = 1 << 16;  // many chunks through both windows
  {  // warm-up: the first load may create runtime-internal device state
    auto warm = native::PreparedWeights::create(spec, *src, {}, lo);
  }
  size_t free0 = 0, free1 = 0, total = 0;
  M3_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  auto pw = native::PreparedWeights::create(spec, *src, {}, lo);
  M3_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  const uint64_t arena = pw->device_bytes(), gran = 2 << 20;
  const uint64_t used = free0 - free1;
  std::printf("  arena %llu bytes, device memory taken %llu bytes\n", (unsigned long long)arena,
              (unsigned long long)used);
  // one allocation of the arena's size, rounded up to the allocator's 2 MiB granularity
  EXPECT_GE(used, arena);
  EXPECT_LE(used, (arena + gran - 1) / gran * gran);
  std::vector<uint8_t> host(arena, 0);
  HostArenaSink sink(host);
  fill_prepared(pw->layout(), *src, sink, pool());
  expect_same_tensors(pw->layout(), device_bytes(*pw), host);
}

TEST(GpuPrepared, CheckpointLoadRanksAndViewsEndToEnd) {
  ModelSpec spec = synthetic_preset("real-heads");  // released attention geometry, small experts
  SyntheticOptions so;
  so.seed = gpu_test_seed() + 1;
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  auto dir = std::filesystem::temp_directory_path() / ("m3_gpu_prepared_" + std::to_string(so.seed));
  write_synthetic_checkpoint(dir, spec, so);
  native::PrepareLoadOptions lo;
  lo.progress = true;  // the bar and the byte table appear in the log
  for (int tp : {1, 2}) {
    PrepareOptions opt;
    opt.tp_size = tp;
    opt.tp_rank = tp - 1;
    auto pw = native::PreparedWeights::load(dir, opt, lo);
    SafetensorsSet files = SafetensorsSet::open(dir);
    WeightBinding bind = bind_weights(build_weight_table(spec, detect_text_prefix(files)), files);
    std::vector<uint8_t> host(pw->device_bytes(), 0);
    HostArenaSink sink(host);
    fill_prepared(pw->layout(), *make_weight_source(bind), sink, pool());
    expect_same_tensors(pw->layout(), device_bytes(*pw), host);
    if (tp != 1) continue;

    // views end to end: a sparse layer's fused projection and its MoE
    int l = 0;
    while (!(spec.sparse(l) && spec.moe(l))) ++l;
    LayerWeights lw = dequantize_prepared_layer(pw->layout(), l, pw->reader());
    native::Fp8Weight qkv = pw->qkv(l);
    EXPECT_EQ(qkv.rows, 64 * 128 + 2 * 4 * 128 + 4 * 128 + 128);
    std::mt19937 rng(so.seed);
    const int M = 3, H = spec.hidden;
    auto x = random_acts(rng, M, H, H);
    DevBuf<float> xd(x.size()), y(size_t(M) * qkv.rows);
    xd.upload(x);
    y.poison();
    native::linear_fp8(qkv, native::ActIn{xd.p, DType::F32, H}, M, y.p, qkv.rows, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    Mat fused(qkv.rows, H);
    size_t at = 0;
    for (const Mat* m : {&lw.wq, &lw.wk, &lw.wv, &lw.wiq, &lw.wik}) {
      std::memcpy(fused.data.data() + at, m->data.data(), m->data.size() * 4);
      at += m->data.size();
    }
    std::vector<float> ref(size_t(M) * qkv.rows);
    ref::linear(fused, x.data(), H, M, ref.data(), qkv.rows, pool());
    double mx = 0;
    for (float v : ref) mx = std::max(mx, double(std::fabs(v)));
    // fp32 sums of 1024 products against double: ~1e-6 relative; a wrong row or scale is O(1)
    expect_close_rows(y.download(), qkv.rows, ref, M, qkv.rows, 1e-5 * mx, 1e-5, "prepared qkv view");

    native::MoeWeights mw = pw->moe(l);
    const size_t wsb = native::moe_workspace_bytes(mw, M);
    DevBuf<uint8_t> ws(wsb);
    DevBuf<float> out(size_t(M) * H);
    out.poison();
    native::moe_forward(mw, xd.p, H, M, out.p, H, ws.p, wsb, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> mref(size_t(M) * H);
    ref::moe_forward(spec, lw, x.data(), M, mref.data(), pool());
    mx = 0;
    for (float v : mref) mx = std::max(mx, double(std::fabs(v)));
    // routing near-ties are improbable with 8 experts and 3 tokens; see test_moe.cpp for the
    // tie-aware comparison
    expect_close_rows(out.download(), H, mref, M, H, 1e-4 * mx, 1e-4, "prepared moe view");
  }
  std::filesystem::remove_all(dir);
}
