// The CPU reference's layers over borrowed tensors and caches (ref/layers.h, the library level's
// NativeLayers): a layer-by-layer loop over the prepared arena's own bytes (each tensor borrowed by
// its name's offset) and over caches the test owns (NaN-poisoned) gives the engine's logits bit
// for bit (make_ref_backend on the same arena dequantized), over a prefill of two sequences of
// random lengths and greedy decode steps; the caches the loop wrote hold what it attended to;
// misuse is refused naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/parallel.h"
#include "model/prepare.h"
#include "model/prepared_tensors.h"
#include "model/synthetic.h"
#include "ref/engine.h"
#include "ref/layers.h"
#include "model/tp_shard.h"
#include "runtime/communicator.h"

#include <thread>

using namespace m3;

namespace {

// One rank's prepared arena filled on the host from w, and its tensors borrowed by name.
struct HostArena {
  PreparedLayout L;
  std::vector<uint8_t> bytes;
  HostArena(const ModelSpec& spec, const ModelWeights& w, int rank, int tp) {
    PrepareOptions po;
    po.tp_rank = rank;
    po.tp_size = tp;
    L = plan_prepared(spec, po);
    bytes.assign(L.total_bytes, 0);
    HostArenaSink sink(bytes);
    ThreadPool pool(2);
    fill_prepared(L, *make_weight_source(w), sink, pool);
  }
  ref::BorrowedLayer borrow(const std::vector<TensorSpec>& v) const {
    ref::BorrowedLayer b;
    for (const TensorSpec& t : v) b.emplace_back(t, bytes.data() + t.offset);
    return b;
  }
  std::vector<ref::BorrowedLayer> layers() const {
    std::vector<ref::BorrowedLayer> v;
    for (int l = 0; l < int(L.layers.size()); ++l) v.push_back(borrow(layer_tensor_specs(L, l)));
    return v;
  }
};

// One rank's fp32 caches (rs: the rank's shapes), NaN-poisoned, and the pointers RefLayers borrows.
struct Caches {
  std::vector<std::vector<float>> k, v, ik;
  std::vector<float*> kp, vp, ikp;
  Caches(const ModelSpec& rs, int blocks) {
    const size_t slots = size_t(blocks) * size_t(rs.index_block);
    for (int l = 0; l < rs.num_layers; ++l) {
      k.emplace_back(slots * rs.kv_dim(), NAN);
      v.emplace_back(slots * rs.kv_dim(), NAN);
      ik.emplace_back(rs.sparse(l) ? slots * rs.index_dim : 0, NAN);
    }
    for (int l = 0; l < rs.num_layers; ++l) {
      kp.push_back(k[size_t(l)].data());
      vp.push_back(v[size_t(l)].data());
      ikp.push_back(rs.sparse(l) ? ik[size_t(l)].data() : nullptr);
    }
  }
};

}  // namespace

TEST(RefLayers, ALayerLoopOverBorrowedTensorsIsTheEngineBitwise) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  const ModelWeights w = synthetic_weights(spec, so);
  const HostArena ha(spec, w, 0, 1);
  const PreparedLayout& L = ha.L;
  const std::vector<uint8_t>& arena = ha.bytes;
  auto borrow = [&](const std::vector<TensorSpec>& v) { return ha.borrow(v); };
  const std::vector<ref::BorrowedLayer> layers = ha.layers();
  const int blocks = 12, slots = blocks * spec.index_block;
  Caches c(spec, blocks);
  auto& k = c.k;
  const auto &kp = c.kp, &vp = c.vp, &ikp = c.ikp;
  ref::RefLayers rl(L, borrow(model_tensor_specs(L)), layers, blocks, kp, vp, ikp, 2);
  auto engine = ref::make_ref_backend(spec, dequantize_prepared(L, host_arena_reader(arena)), ref::RefOptions{blocks, 2});

  std::vector<std::vector<int32_t>> seqs(2);
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}};
  for (auto& s : seqs) {
    const int n = 1 + int(rng() % 80);  // up to 5 blocks of 16: past the sparse window (4 blocks)
    for (int i = 0; i < n; ++i) s.push_back(int32_t(rng() % unsigned(spec.vocab_size)));
  }
  std::vector<int> done(2, 0);
  size_t compared = 0;
  for (int step = 0; step < 8; ++step) {
    StepBatch b;
    for (int i = 0; i < 2; ++i) {
      SeqStep q;
      q.start_pos = done[size_t(i)];
      q.tokens.assign(seqs[size_t(i)].begin() + done[size_t(i)], seqs[size_t(i)].end());
      q.block_table = tables[size_t(i)];
      q.all_logits = step == 0 && i == 1;  // every prompt row of one sequence at the prefill
      b.seqs.push_back(q);
    }
    const StepOutput want = engine->step(b);
    rl.prepare_step(b);
    std::vector<float> x = rl.embed();
    for (int l = 0; l < spec.num_layers; ++l) rl.forward_layer(l, x.data());
    const std::vector<float> got = rl.logits(x.data());
    ASSERT_EQ(got.size(), want.logits.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &want.logits[i], 4) != 0 && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << "step " << step << ": " << differ << " of " << got.size() << " logits differ, first at "
                          << first << " (" << got[first] << " vs " << want.logits[first] << ")";
    compared += got.size();
    for (int i = 0; i < 2; ++i) {
      done[size_t(i)] = int(seqs[size_t(i)].size());
      const float* row = want.row(i, want.num_rows[size_t(i)] - 1);
      seqs[size_t(i)].push_back(int32_t(std::max_element(row, row + spec.vocab_size) - row));
    }
  }
  // the borrowed caches: exactly the written positions hold values (layer 0's K)
  int64_t finite_rows = 0;
  for (int s = 0; s < slots; ++s) finite_rows += std::isfinite(k[0][size_t(s) * spec.kv_dim()]) ? 1 : 0;
  EXPECT_EQ(finite_rows, int64_t(done[0] + done[1]));
  std::printf("  [ref layers] %zu logits bitwise equal to the engine's over 8 steps\n", compared);

  // misuse
  EXPECT_THROW(rl.forward_layer(spec.num_layers, nullptr), Error);
  ref::RefLayers fresh(L, borrow(model_tensor_specs(L)), layers, blocks, kp, vp, ikp, 1);
  EXPECT_THROW(fresh.embed(), Error);  // before prepare_step
  auto bad_ik = ikp;
  bad_ik[0] = k[0].data();  // an index-K buffer on a full-attention layer
  if (!spec.sparse(0)) EXPECT_THROW(ref::RefLayers(L, borrow(model_tensor_specs(L)), layers, blocks, kp, vp, bad_ik, 1), Error);
  std::vector<ref::BorrowedLayer> short_layers(layers.begin(), layers.end() - 1);
  EXPECT_THROW(ref::RefLayers(L, borrow(model_tensor_specs(L)), short_layers, blocks, kp, vp, ikp, 1), Error);
}

TEST(RefLayers, TensorParallelRanksAreTheEngineRanksBitwise) {
  // two RefLayers ranks (threads, an in-process group), each over its own rank arena's bytes and its
  // own caches, against the engine's TP 2 over the same two arenas dequantized: the same logits bit
  // for bit on both ranks (partial sums added in rank order, logits gathered)
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  const ModelWeights w = synthetic_weights(spec, so);
  constexpr int N = 2;
  const ModelSpec rs = tp_rank_spec(spec, N);
  std::vector<std::unique_ptr<HostArena>> ha;
  for (int r = 0; r < N; ++r) ha.push_back(std::make_unique<HostArena>(spec, w, r, N));
  std::vector<PreparedLayout> L;
  for (int r = 0; r < N; ++r) L.push_back(ha[size_t(r)]->L);
  const int blocks = 8;
  ref::RefOptions ro{blocks, 2};
  ro.tp = N;
  auto engine = ref::make_ref_backend_from_ranks(
      spec, [&](int r) { return dequantize_prepared(L[size_t(r)], host_arena_reader(ha[size_t(r)]->bytes)); }, ro);
  LocalGroup group(N);
  std::vector<std::unique_ptr<ref::RefLayers>> ranks;
  std::vector<std::unique_ptr<Caches>> caches;
  for (int r = 0; r < N; ++r) {
    const std::vector<ref::BorrowedLayer> layers = ha[size_t(r)]->layers();
    caches.push_back(std::make_unique<Caches>(rs, blocks));
    const auto &k = caches.back()->kp, &v = caches.back()->vp, &ik = caches.back()->ikp;
    ranks.push_back(std::make_unique<ref::RefLayers>(L[size_t(r)], ha[size_t(r)]->borrow(model_tensor_specs(L[size_t(r)])), layers,
                                                     blocks, k, v, ik, 1, group.rank(r)));
  }
  std::vector<int32_t> seq;
  for (int i = 0; i < 1 + int(rng() % 70); ++i) seq.push_back(int32_t(rng() % unsigned(spec.vocab_size)));
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  int done = 0;
  size_t compared = 0;
  for (int step = 0; step < 6; ++step) {
    StepBatch b;
    SeqStep q;
    q.start_pos = done;
    q.tokens.assign(seq.begin() + done, seq.end());
    q.block_table = table;
    b.seqs.push_back(q);
    const StepOutput want = engine->step(b);
    std::vector<std::vector<float>> got(N);
    std::vector<std::thread> th;
    for (int r = 0; r < N; ++r)
      th.emplace_back([&, r] {
        ref::RefLayers& rl = *ranks[size_t(r)];
        rl.prepare_step(b);
        std::vector<float> x = rl.embed();
        for (int l = 0; l < spec.num_layers; ++l) rl.forward_layer(l, x.data());
        got[size_t(r)] = rl.logits(x.data());
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < N; ++r) {
      ASSERT_EQ(got[size_t(r)].size(), want.logits.size());
      EXPECT_EQ(std::memcmp(got[size_t(r)].data(), want.logits.data(), want.logits.size() * 4), 0)
          << "step " << step << " rank " << r;
    }
    compared += want.logits.size();
    done = int(seq.size());
    seq.push_back(int32_t(std::max_element(want.logits.begin(), want.logits.end()) - want.logits.begin()));
  }
  std::printf("  [ref layers tp2] %zu logits bitwise the engine's on both ranks\n", compared);
  // a rank's tensors under another rank's communicator are refused
  LocalGroup g2(N);
  auto c1 = g2.rank(1);
  EXPECT_THROW(ref::RefLayers(L[0], {}, {}, blocks, {}, {}, {}, 1, std::move(c1)), Error);
}
