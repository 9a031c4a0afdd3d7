// The native GPU path's layers over BORROWED device tensors (native/device_layers.h; the Python
// module's NativeLayers on "cuda", issue 16): every tensor of tiny-m3-a's prepared arena copied
// into its own cudaMalloc (as a framework holds them) and FP8 caches the test allocates, poisoned
// with E4M3 NaN. A layer loop (prepare_step, embed, forward_layers over random cuts of the model,
// logits) over a prefill of two sequences and decode steps gives the engine's logits (CudaBackend
// on the arena it loaded) bit for bit; the views point into the borrowed buffers (no copy), and
// creation allocates no weight or cache memory (only activations and metadata).
// The library level's Mono (the same layers with mono's runner on the sparse range): decode steps of
// 1 to 4 sequences give the engine's logits bit for bit (mono never changes the bits), a prefill
// is refused naming why, and a CUDA graph of the layer calls captured on one step replays the
// engine's logits of later steps (the decode plans do not depend on the step's contexts).
// At tensor parallelism 2 on one GPU (host-staged collectives), each rank's layers over its own
// borrowed shard, on its own thread with its own random cuts, give the TP engine's logits bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "model/prepared_tensors.h"
#include "mono/mono.h"
#include "native/cuda_tp_backend.h"
#include "native/device_comm.h"
#include "native/device_layers.h"
#include "runtime/communicator.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

struct Buffers {  // device buffers the test owns (the "framework")
  std::vector<void*> p;
  Buffers() = default;
  Buffers(Buffers&& o) noexcept : p(std::move(o.p)) {}
  Buffers(const Buffers&) = delete;
  ~Buffers() {
    for (void* q : p) cudaFree(q);
  }
  void* alloc(size_t n) {
    void* q = nullptr;
    M3_CUDA_CHECK(cudaMalloc(&q, std::max<size_t>(n, 16)));
    p.push_back(q);
    return q;
  }
};

// The framework's copies of every tensor of m's arena, one allocation each, and FP8 caches of
// `blocks` blocks poisoned with E4M3 NaN.
struct Lent {
  Buffers fw;
  std::vector<std::pair<TensorSpec, const void*>> borrowed;
  native::KvCacheShape shape;
  std::vector<void*> k, v, ik;
  std::unique_ptr<native::DeviceKvCache> cache() const { return std::make_unique<native::DeviceKvCache>(shape, k, v, ik); }
};

Lent lend(const native::PreparedWeights& pw, int blocks) {
  const PreparedLayout& L = pw.layout();
  const ModelSpec s = prepared_rank_spec(L, L.opt.tp_rank, L.opt.tp_size, "test");
  Lent r;
  std::vector<TensorSpec> all = model_tensor_specs(L);
  for (int l = 0; l < s.num_layers; ++l) {
    auto t = layer_tensor_specs(L, l);
    all.insert(all.end(), t.begin(), t.end());
  }
  for (const TensorSpec& t : all) {
    void* q = r.fw.alloc(t.bytes);
    M3_CUDA_CHECK(cudaMemcpy(q, pw.device_base() + t.offset, t.bytes, cudaMemcpyDeviceToDevice));
    r.borrowed.emplace_back(t, q);
  }
  r.shape = native::kv_cache_shape(s, blocks);
  for (int l = 0; l < s.num_layers; ++l) {
    r.k.push_back(r.fw.alloc(r.shape.kv_bytes()));
    r.v.push_back(r.fw.alloc(r.shape.kv_bytes()));
    r.ik.push_back(r.shape.has_index[size_t(l)] ? r.fw.alloc(r.shape.ik_bytes()) : nullptr);
    M3_CUDA_CHECK(cudaMemset(r.k.back(), 0x7f, r.shape.kv_bytes()));  // E4M3 NaN
    M3_CUDA_CHECK(cudaMemset(r.v.back(), 0x7f, r.shape.kv_bytes()));
    if (r.ik.back()) M3_CUDA_CHECK(cudaMemset(r.ik.back(), 0x7f, r.shape.ik_bytes()));
  }
  return r;
}

// Bitwise equality of two logit arrays: the count of differing (or non-finite) values, the first
// one described in *where.
size_t bit_diffs(const std::vector<float>& got, const std::vector<float>& want, int V, std::string* where) {
  size_t diff = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    uint32_t a, c;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&c, &want[i], 4);
    if (a != c || !std::isfinite(got[i])) {
      if (diff == 0)
        *where = "row " + std::to_string(i / size_t(V)) + " column " + std::to_string(i % size_t(V)) + ": " +
                 std::to_string(got[i]) + " vs " + std::to_string(want[i]);
      ++diff;
    }
  }
  return diff + (got.size() != want.size() ? 1 : 0);
}

}  // namespace

TEST(GpuDeviceLayers, BorrowedLayersAreTheEngineBitwise) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  PreparedModel m = prepare_from_dir(test_data_dir() / "tiny-m3-a");
  const ModelSpec& s = m.spec;
  const PreparedLayout& L = m.pw->layout();
  const int blocks = 96, len = blocks * s.index_block, max_tokens = 512;

  Lent fw = lend(*m.pw, blocks);
  auto& borrowed = fw.borrowed;
  auto& shape = fw.shape;
  auto &k = fw.k, &v = fw.v, &ik = fw.ik;

  // a missing tensor, or a foreign one, is refused naming it
  {
    auto less = borrowed;
    const std::string gone = less.back().first.name;
    less.pop_back();
    try {
      native::PreparedWeights::borrow(L, less);
      ADD_FAILURE() << "a missing tensor was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
    }
  }

  // what a Forward of these options takes by itself (activations, metadata) over the loaded arena
  native::ForwardOptions fo;
  fo.max_tokens = max_tokens;
  fo.max_model_len = len;
  fo.logits_rows = 256;
  size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  M3_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  uint64_t forward_bytes = 0;
  {
    native::DeviceKvCache tmp(shape, k, v, ik);
    native::Forward f(m.pw, tmp, fo);
    M3_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    forward_bytes = free0 - free1;
  }
  M3_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  auto weights = std::shared_ptr<const native::PreparedWeights>(native::PreparedWeights::borrow(L, borrowed));
  native::DeviceLayers dl(weights, std::make_unique<native::DeviceKvCache>(shape, k, v, ik), max_tokens, len);
  M3_CUDA_CHECK(cudaMemGetInfo(&free2, &total));
  const uint64_t weight_bytes = L.total_bytes, cache_bytes = shape.total_bytes(), took = free0 - free2;
  std::printf("  borrowed: %llu weight bytes, %llu cache bytes; creation took %llu device bytes (a Forward alone: "
              "%llu)\n", (unsigned long long)weight_bytes, (unsigned long long)cache_bytes, (unsigned long long)took,
              (unsigned long long)forward_bytes);
  EXPECT_EQ(weights->device_base(), nullptr);
  // pointer identity: the views are the borrowed buffers
  auto buf = [&](int layer, const std::string& name) -> const void* {
    const std::vector<TensorSpec> want = layer < 0 ? model_tensor_specs(L) : layer_tensor_specs(L, layer);
    for (const auto& [t, q] : borrowed)
      if (t.name == name)
        for (const TensorSpec& w : want)
          if (w.name == name && w.offset == t.offset) return q;
    return reinterpret_cast<const void*>(uintptr_t(1));
  };
  int checked = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    const native::LayerViews& lv = dl.model().layer(l);
    EXPECT_EQ(static_cast<const void*>(lv.qkv.codes), buf(l, "qkv.codes")) << "layer " << l;
    EXPECT_EQ(static_cast<const void*>(lv.o.codes), buf(l, "o.codes")) << "layer " << l;
    EXPECT_EQ(static_cast<const void*>(lv.norms.input), buf(l, "input_norm")) << "layer " << l;
    checked += 3;
    if (s.moe(l)) {
      EXPECT_EQ(static_cast<const void*>(lv.moe.w13.codes), buf(l, "w13.codes")) << "layer " << l;
      EXPECT_EQ(static_cast<const void*>(lv.moe.router.data), buf(l, "router")) << "layer " << l;
      checked += 2;
    }
    EXPECT_EQ(dl.model().cache().layer(l).k, k[size_t(l)]);
  }
  EXPECT_EQ(static_cast<const void*>(weights->embed().data), buf(-1, "embed"));
  EXPECT_EQ(static_cast<const void*>(weights->lm_head().data), buf(-1, "lm_head"));
  std::printf("  %d views checked against the borrowed buffers\n", checked + 2);
  // nothing beyond what a Forward takes by itself (its activations and metadata; the allocator's
  // 2 MiB granularity): no weight or cache memory
  EXPECT_LE(took, forward_bytes + (2u << 20)) << "creation allocated beyond the activations";

  // the engine on the arena it loaded
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  o.max_model_len = len;
  auto engine = native::make_cuda_backend(m.pw, o);

  const int H = s.hidden, V = s.vocab_size;
  float *x = nullptr, *out = nullptr;
  M3_CUDA_CHECK(cudaMalloc(&x, size_t(max_tokens) * H * 4));
  M3_CUDA_CHECK(cudaMalloc(&out, size_t(max_tokens) * V * 4));
  cudaStream_t st = nullptr;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  std::uniform_int_distribution<int> tok(0, V - 1);
  struct Seq {
    std::vector<int32_t> table;
    int pos = 0;
  };
  std::vector<Seq> seqs(2);
  std::vector<int> prompt = {int(rng() % 40) + 8, int(rng() % 300) + 140};  // the second spans blocks
  {
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    for (int i = 0; i < blocks; ++i) ids[size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);  // tables in no order, disjoint
    size_t at = 0;
    for (int i = 0; i < 2; ++i) {
      const int need = (prompt[size_t(i)] + 16 + s.index_block - 1) / s.index_block;
      seqs[size_t(i)].table.assign(ids.begin() + long(at), ids.begin() + long(at + size_t(need)));
      at += size_t(need);
    }
  }
  std::printf("  prompts of %d and %d tokens, then 11 decode steps\n", prompt[0], prompt[1]);
  size_t compared = 0;
  for (int step = 0; step < 12; ++step) {
    StepBatch b;
    for (int i = 0; i < 2; ++i) {
      SeqStep q;
      q.start_pos = seqs[size_t(i)].pos;
      const int n = step == 0 ? prompt[size_t(i)] : 1;
      for (int j = 0; j < n; ++j) q.tokens.push_back(tok(rng));
      const int need = (q.start_pos + n + s.index_block - 1) / s.index_block;
      q.block_table.assign(seqs[size_t(i)].table.begin(), seqs[size_t(i)].table.begin() + need);
      q.all_logits = step == 0 && i == 0;  // every prompt row of the first
      seqs[size_t(i)].pos += n;
      b.seqs.push_back(q);
    }
    const StepOutput want = engine->step(b);
    // the layer loop, in random cuts
    std::vector<float> got;
    {
      ASSERT_LE(b.num_tokens(), max_tokens);
      dl.prepare_step(b, st);
      const int T = dl.num_tokens(), R = dl.num_out_rows();
      M3_CUDA_CHECK(cudaMemsetAsync(x, 0xff, size_t(max_tokens) * H * 4, st));  // NaN
      M3_CUDA_CHECK(cudaMemsetAsync(out, 0xff, size_t(max_tokens) * V * 4, st));
      dl.embed(x, st);
      int l0 = 0;
      while (l0 < s.num_layers) {
        const int l1 = l0 + 1 + int(rng() % uint64_t(s.num_layers - l0));
        dl.forward_layers(l0, l1, x, st);
        l0 = l1;
      }
      dl.logits(x, out, st);
      got.resize(size_t(R) * V);
      M3_CUDA_CHECK(cudaMemcpyAsync(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost, st));
      M3_CUDA_CHECK(cudaStreamSynchronize(st));
      ASSERT_EQ(T, b.num_tokens());
    }
    std::string where;
    EXPECT_EQ(bit_diffs(got, want.logits, V, &where), 0u) << "step " << step << ": logits differ from the engine's, "
                                                             "the first at " << where;
    compared += got.size();
  }
  std::printf("  %zu logits compared bitwise with the engine's\n", compared);
  cudaFree(x);
  cudaFree(out);
  cudaStreamDestroy(st);
}

TEST(GpuDeviceLayers, MonoOverBorrowedLayersIsTheEngineBitwise) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  PreparedModel m = prepare_from_dir(test_data_dir() / "tiny-m3-a");
  const ModelSpec& s = m.spec;
  const int blocks = 96, len = blocks * s.index_block, L = s.num_layers, H = s.hidden, V = s.vocab_size;
  Lent fw = lend(*m.pw, blocks);
  auto weights = std::shared_ptr<const native::PreparedWeights>(native::PreparedWeights::borrow(m.pw->layout(), fw.borrowed));
  // NativeLayers runs the prefills, Mono the decode steps, over the same borrowed caches
  native::DeviceLayers nat(weights, fw.cache(), 512, len);
  native::DeviceLayers mo(weights, fw.cache(), 16, len);
  {
    auto made = mono::create(mo.model(), {});
    if (auto* r = std::get_if<mono::Refusal>(&made)) FAIL() << r->text();
    mo.set_runner(std::move(std::get<std::unique_ptr<mono::MonoRunner>>(made)));
  }
  auto* runner = dynamic_cast<mono::MonoRunner*>(mo.runner());
  ASSERT_NE(runner, nullptr);
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  o.max_model_len = len;
  auto engine = with_mono(m, o);

  float *x = nullptr, *out = nullptr;
  M3_CUDA_CHECK(cudaMalloc(&x, size_t(512) * H * 4));
  M3_CUDA_CHECK(cudaMalloc(&out, size_t(512) * V * 4));
  cudaStream_t st = nullptr;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto poison = [&] {
    M3_CUDA_CHECK(cudaMemsetAsync(x, 0xff, size_t(512) * H * 4, st));  // NaN
    M3_CUDA_CHECK(cudaMemsetAsync(out, 0xff, size_t(512) * V * 4, st));
  };
  auto fetch = [&](native::DeviceLayers& dl) {
    std::vector<float> got(size_t(dl.num_out_rows()) * V);
    M3_CUDA_CHECK(cudaMemcpyAsync(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost, st));
    M3_CUDA_CHECK(cudaStreamSynchronize(st));
    return got;
  };
  // the layer calls of a prepared step: the whole model, or random cuts
  auto layers = [&](native::DeviceLayers& dl, bool cuts) {
    dl.embed(x, st);
    int l0 = 0;
    while (l0 < L) {
      const int l1 = cuts ? l0 + 1 + int(rng() % uint64_t(L - l0)) : L;
      dl.forward_layers(l0, l1, x, st);
      l0 = l1;
    }
    dl.logits(x, out, st);
  };
  auto refused = [&](const StepBatch& b, const std::string& why) {
    try {
      mo.prepare_step(b, st);
      return std::string("accepted");
    } catch (const Error& e) {
      return std::string(e.what()).find(why) == std::string::npos ? std::string(e.what()) : std::string();
    }
  };

  std::uniform_int_distribution<int> tok(0, V - 1);
  struct Seq {
    std::vector<int32_t> table;
    int pos = 0;
  };
  std::vector<Seq> seqs(5);
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  for (int i = 0; i < blocks; ++i) ids[size_t(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int i = 0; i < 5; ++i) seqs[size_t(i)].table.assign(ids.begin() + 18 * i, ids.begin() + 18 * (i + 1));
  auto step_of = [&](const std::vector<int>& which, const std::vector<int>& n, bool all_logits) {
    StepBatch b;
    for (size_t j = 0; j < which.size(); ++j) {
      Seq& q = seqs[size_t(which[j])];
      SeqStep r;
      r.start_pos = q.pos;
      for (int t = 0; t < n[j]; ++t) r.tokens.push_back(tok(rng));
      r.block_table.assign(q.table.begin(), q.table.begin() + (q.pos + n[j] + s.index_block - 1) / s.index_block);
      r.all_logits = all_logits;
      b.seqs.push_back(r);
    }
    return b;
  };
  auto advance = [&](const StepBatch& b, const std::vector<int>& which) {
    for (size_t j = 0; j < which.size(); ++j) seqs[size_t(which[j])].pos += int(b.seqs[j].tokens.size());
  };
  size_t compared = 0;
  auto compare = [&](const std::vector<float>& got, const StepOutput& want, const std::string& what) {
    std::string where;
    EXPECT_EQ(bit_diffs(got, want.logits, V, &where), 0u) << what << ": logits differ from the engine's, the first at "
                                                          << where;
    compared += got.size();
  };

  // prefills of 5 sequences through NativeLayers (Mono refuses them, naming why)
  std::vector<int> all = {0, 1, 2, 3, 4}, lens;
  for (int i = 0; i < 5; ++i) lens.push_back(int(rng() % 95) + 5);  // at most 495 tokens: NativeLayers' 512
  const StepBatch pre = step_of(all, lens, false);
  EXPECT_EQ(refused(pre, "prefill"), "") << "a prefill step";
  nat.prepare_step(pre, st);
  poison();
  layers(nat, true);
  compare(fetch(nat), engine->step(pre), "prefill");
  advance(pre, all);

  // decode steps through Mono: the first of 4 sequences over the whole model, then random subsets
  // and cuts, a verify step, and refusals that leave it serving
  for (int step = 0; step < 10; ++step) {
    std::vector<int> which = {0, 1, 2, 3};
    if (step > 0) {
      std::shuffle(which.begin(), which.end(), rng);
      which.resize(size_t(1 + rng() % 4));
    }
    const int q = step == 5 ? 3 : 1;  // a verify step: 3 query tokens a sequence, logits of each
    const StepBatch b = step_of(which, std::vector<int>(which.size(), q), q > 1);
    if (step == 3) {
      EXPECT_EQ(refused(step_of(all, std::vector<int>(5, 1), false), "batch_too_large"), "") << "5 sequences";
      EXPECT_EQ(refused(step_of({0, 1}, {1, 2}, false), "uneven_query"), "") << "query lengths 1 and 2";
    }
    mo.prepare_step(b, st);
    poison();
    layers(mo, step > 0);
    compare(fetch(mo), engine->step(b), fmt::format("decode step {} ({} sequences of {} tokens)", step, which.size(), q));
    advance(b, which);
  }
  EXPECT_EQ(runner->describe().find("no program"), std::string::npos) << runner->describe();

  // a CUDA graph of the layer calls captured over one step of 4 sequences replays later steps
  // (prepare_step uploads their tokens and tables; the plan and mono's program stay)
  cudaGraphExec_t exec = nullptr;
  for (int step = 0; step < 3; ++step) {
    std::vector<int> which = {0, 1, 2, 3};
    const StepBatch b = step_of(which, {1, 1, 1, 1}, false);
    mo.prepare_step(b, st);
    poison();
    if (!exec) {
      cudaGraph_t g = nullptr;
      M3_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      layers(mo, false);
      M3_CUDA_CHECK(cudaStreamEndCapture(st, &g));
      M3_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      M3_CUDA_CHECK(cudaGraphDestroy(g));
    }
    M3_CUDA_CHECK(cudaGraphLaunch(exec, st));
    compare(fetch(mo), engine->step(b), fmt::format("graph replay {}", step));
    advance(b, which);
  }
  M3_CUDA_CHECK(cudaGraphExecDestroy(exec));
  std::printf("  %zu logits of a prefill, 10 mono decode steps and 3 graph replays compared bitwise with the engine's\n",
              compared);
  std::printf("  %s\n", runner->describe().c_str());
  cudaFree(x);
  cudaFree(out);
  cudaStreamDestroy(st);
}

TEST(GpuDeviceLayers, TensorParallelRanksAreTheEngineBitwise) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kTp = 2;
  const auto dir = test_data_dir() / "tiny-m3-a";
  auto load = [&](int r) {
    native::PrepareLoadOptions lo;
    lo.progress = false;
    PrepareOptions po;
    po.tp_rank = r;
    po.tp_size = kTp;
    return std::shared_ptr<const native::PreparedWeights>(native::PreparedWeights::load(dir, po, lo));
  };
  std::vector<std::shared_ptr<const native::PreparedWeights>> arenas;
  for (int r = 0; r < kTp; ++r) arenas.push_back(load(r));
  const ModelSpec s = arenas[0]->spec();
  const int blocks = 48, len = blocks * s.index_block, L = s.num_layers, H = s.hidden, V = s.vocab_size;

  native::CudaTpOptions to;
  to.tp = kTp;
  to.comm = "host";
  to.devices = {0, 0};
  to.backend.num_cache_blocks = blocks;
  to.backend.max_model_len = len;
  auto engine = native::make_cuda_tp_backend([&](int r) { return arenas[size_t(r)]; }, to);

  // each rank: its shard lent, its layers, a host-staged communicator of one group
  LocalGroup group(kTp);
  std::vector<Lent> lent;
  std::vector<std::unique_ptr<native::DeviceLayers>> ranks;
  for (int r = 0; r < kTp; ++r) {
    lent.push_back(lend(*arenas[size_t(r)], blocks));
    auto w = std::shared_ptr<const native::PreparedWeights>(
        native::PreparedWeights::borrow(arenas[size_t(r)]->layout(), lent.back().borrowed));
    ranks.push_back(std::make_unique<native::DeviceLayers>(w, lent.back().cache(), 512, len,
                                                           native::make_host_staged_comm(group.rank(r))));
  }
  struct RankBufs {
    float *x = nullptr, *out = nullptr;
    cudaStream_t st = nullptr;
  };
  std::vector<RankBufs> bufs(kTp);
  for (auto& b : bufs) {
    M3_CUDA_CHECK(cudaMalloc(&b.x, size_t(512) * H * 4));
    M3_CUDA_CHECK(cudaMalloc(&b.out, size_t(512) * V * 4));
    M3_CUDA_CHECK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
  }

  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<std::vector<int32_t>> tables(3);
  std::vector<int> pos(3, 0);
  {
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    for (int i = 0; i < blocks; ++i) ids[size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < 3; ++i) tables[size_t(i)].assign(ids.begin() + 16 * i, ids.begin() + 16 * (i + 1));
  }
  size_t compared = 0;
  for (int step = 0; step < 8; ++step) {
    StepBatch b;
    for (int i = 0; i < 3; ++i) {
      SeqStep q;
      q.start_pos = pos[size_t(i)];
      const int n = step == 0 ? int(rng() % 150) + 4 : (step == 4 && i == 1 ? 5 : 1);  // prefills, a mixed step
      for (int j = 0; j < n; ++j) q.tokens.push_back(tok(rng));
      q.block_table.assign(tables[size_t(i)].begin(),
                           tables[size_t(i)].begin() + (q.start_pos + n + s.index_block - 1) / s.index_block);
      q.all_logits = step == 0 && i == 2;
      pos[size_t(i)] += n;
      b.seqs.push_back(q);
    }
    const StepOutput want = engine->step(b);
    // every rank's loop on its own thread, with cuts of its own (collectives are inside layers)
    std::vector<uint64_t> cut_seed = {rng(), rng()};
    std::vector<std::vector<float>> got(kTp);
    std::vector<std::string> err(kTp);
    std::vector<std::thread> th;
    for (int r = 0; r < kTp; ++r)
      th.emplace_back([&, r] {
        try {
          std::mt19937_64 cr(cut_seed[size_t(r)]);
          native::DeviceLayers& dl = *ranks[size_t(r)];
          RankBufs& bb = bufs[size_t(r)];
          M3_CUDA_CHECK(cudaSetDevice(0));
          dl.prepare_step(b, bb.st);
          M3_CUDA_CHECK(cudaMemsetAsync(bb.x, 0xff, size_t(512) * H * 4, bb.st));
          M3_CUDA_CHECK(cudaMemsetAsync(bb.out, 0xff, size_t(512) * V * 4, bb.st));
          dl.embed(bb.x, bb.st);
          for (int l0 = 0; l0 < L;) {
            const int l1 = l0 + 1 + int(cr() % uint64_t(L - l0));
            dl.forward_layers(l0, l1, bb.x, bb.st);
            l0 = l1;
          }
          dl.logits(bb.x, bb.out, bb.st);
          got[size_t(r)].resize(size_t(dl.num_out_rows()) * V);
          M3_CUDA_CHECK(cudaMemcpyAsync(got[size_t(r)].data(), bb.out, got[size_t(r)].size() * 4, cudaMemcpyDeviceToHost,
                                        bb.st));
          M3_CUDA_CHECK(cudaStreamSynchronize(bb.st));
        } catch (const std::exception& e) {
          err[size_t(r)] = e.what();
        }
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < kTp; ++r) {
      ASSERT_EQ(err[size_t(r)], "") << "rank " << r << " step " << step;
      std::string where;
      EXPECT_EQ(bit_diffs(got[size_t(r)], want.logits, V, &where), 0u)
          << "rank " << r << " step " << step << ": logits differ from the TP engine's, the first at " << where;
      compared += got[size_t(r)].size();
    }
  }
  std::printf("  tp %d: %zu logits (both ranks, a prefill, a mixed step, decode steps) compared bitwise with the TP "
              "engine's\n", kTp, compared);
  for (auto& b : bufs) {
    cudaFree(b.x);
    cudaFree(b.out);
    cudaStreamDestroy(b.st);
  }
}
