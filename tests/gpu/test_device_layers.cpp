// The native GPU path's layers over BORROWED device tensors (native/device_layers.h; the Python
// module's NativeLayers on "cuda", issue 16): every tensor of tiny-m3-a's prepared arena copied
// into its own cudaMalloc (as a framework holds them) and FP8 caches the test allocates, poisoned
// with E4M3 NaN. A layer loop (prepare_step, embed, forward_layers over random cuts of the model,
// logits) over a prefill of two sequences and decode steps gives the engine's logits (CudaBackend
// on the arena it loaded) bit for bit; the views point into the borrowed buffers (no copy), and
// creation allocates no weight or cache memory (only activations and metadata).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "model/prepared_tensors.h"
#include "native/device_layers.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

struct Buffers {  // device buffers the test owns (the "framework")
  std::vector<void*> p;
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

}  // namespace

TEST(GpuDeviceLayers, BorrowedLayersAreTheEngineBitwise) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  PreparedModel m = prepare_from_dir(test_data_dir() / "tiny-m3-a");
  const ModelSpec& s = m.spec;
  const PreparedLayout& L = m.pw->layout();
  const int blocks = 96, len = blocks * s.index_block, max_tokens = 512;

  // the framework's copies of every tensor, one allocation each
  Buffers fw;
  std::vector<std::pair<TensorSpec, const void*>> borrowed;
  std::vector<TensorSpec> all = model_tensor_specs(L);
  for (int l = 0; l < s.num_layers; ++l) {
    auto t = layer_tensor_specs(L, l);
    all.insert(all.end(), t.begin(), t.end());
  }
  for (const TensorSpec& t : all) {
    void* q = fw.alloc(t.bytes);
    M3_CUDA_CHECK(cudaMemcpy(q, m.pw->device_base() + t.offset, t.bytes, cudaMemcpyDeviceToDevice));
    borrowed.emplace_back(t, q);
  }
  auto shape = native::kv_cache_shape(s, blocks);
  std::vector<void*> k, v, ik;
  for (int l = 0; l < s.num_layers; ++l) {
    k.push_back(fw.alloc(shape.kv_bytes()));
    v.push_back(fw.alloc(shape.kv_bytes()));
    ik.push_back(shape.has_index[size_t(l)] ? fw.alloc(shape.ik_bytes()) : nullptr);
  }
  for (int l = 0; l < s.num_layers; ++l) {
    M3_CUDA_CHECK(cudaMemset(k[size_t(l)], 0x7f, shape.kv_bytes()));  // E4M3 NaN
    M3_CUDA_CHECK(cudaMemset(v[size_t(l)], 0x7f, shape.kv_bytes()));
    if (ik[size_t(l)]) M3_CUDA_CHECK(cudaMemset(ik[size_t(l)], 0x7f, shape.ik_bytes()));
  }

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
    ASSERT_EQ(got.size(), want.logits.size()) << "step " << step;
    size_t diff = 0, worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, c;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&c, &want.logits[i], 4);
      if (a != c || !std::isfinite(got[i])) {
        if (diff == 0) worst = i;
        ++diff;
      }
    }
    EXPECT_EQ(diff, 0u) << "step " << step << ": " << diff << " logits differ from the engine's, the first row "
                        << worst / size_t(V) << " column " << worst % size_t(V) << ": " << got[worst] << " vs "
                        << want.logits[worst];
    compared += got.size();
  }
  std::printf("  %zu logits compared bitwise with the engine's\n", compared);
  cudaFree(x);
  cudaFree(out);
  cudaStreamDestroy(st);
}
