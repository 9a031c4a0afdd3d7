// The CUDA native backend (native/cuda_backend.h) on a tiny synthetic model:
// - mixed batches (prefill chunks + decode rows in one step, all_logits rows, a step larger than
//   max_tokens run in chunks, padded decode buckets) against the CPU reference on the same
//   dequantized prepared weights: logits cosine, argmax, indexer selections as sets;
// - decode buckets replayed from CUDA graphs are bitwise equal to the same launches run eagerly,
//   and to a third backend whose physical block tables are a different permutation;
// - padding rows and everything outside the block tables never write the caches (poisoned with
//   0x7f, an E4M3 NaN, before the first step; a read of an unwritten slot would turn logits NaN);
// - malformed steps throw m3::Error and leave the backend usable.
#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <numeric>

#include "native/kv_cache.h"
#include "native/layer_plan.h"
#include "native/linear.h"
#include "native/mma_rope.h"
#include "native/moe.h"
#include "native/router.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

struct SeqState {
  std::vector<int32_t> table;
  std::vector<int32_t> prompt;
  int pos = 0;       // tokens in the cache
  int32_t next = 0;  // token to feed next
};

std::vector<int32_t> random_ids(int n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Physical blocks [0, n) in a random order.
std::vector<int32_t> shuffled_blocks(int n, std::mt19937_64& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

std::vector<uint8_t> download(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  M3_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// Every byte of the blocks not in `used` still holds the poison byte, in every cache of every layer.
void expect_untouched(native::CudaBackend& b, const std::vector<uint8_t>& used, uint8_t poison) {
  auto& c = b.kv_cache();
  const auto& sh = c.shape();
  size_t bad = 0;
  for (int l = 0; l < sh.num_layers; ++l) {
    native::KvLayerView v = c.layer(l);
    const size_t kvb = sh.kv_bytes() / size_t(sh.num_blocks), ikb = sh.index_dim ? sh.ik_bytes() / size_t(sh.num_blocks) : 0;
    std::vector<std::pair<void*, size_t>> caches{{v.k, kvb}, {v.v, kvb}};
    if (v.ik) caches.emplace_back(v.ik, ikb);
    for (auto [ptr, per_block] : caches) {
      auto h = download(ptr, per_block * size_t(sh.num_blocks));
      for (int blk = 0; blk < sh.num_blocks; ++blk) {
        if (used[size_t(blk)]) continue;
        for (size_t i = 0; i < per_block; ++i) bad += h[size_t(blk) * per_block + i] != poison;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "bytes written outside the block tables (padding rows must write nothing)";
}

}  // namespace

TEST(GpuCudaBackend, MixedBatchesMatchReference) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec spec = synthetic_preset("tiny");  // hidden 256, 8/2 heads of 64, index 2 x 64, block 16, top-4
  SyntheticOptions so;
  so.seed = seed;
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int blocks = 48, V = spec.vocab_size;
  auto ref = ref_backend(m, blocks);  // exact caches: it picks every next token
  // The BF16-cache backend is checked against the reference that rounds its caches the same way
  // (ref/cache_codec.h), so that what is left is accumulation order and the pass split; before
  // 2026-12-02 it was checked against the exact reference, and the 2^-9 rounding of every cached
  // K/V element (which the yardstick below does not model) made the gate a coin toss at a handful
  // of argmax differences: seeds 1356756197255282236 (1 - median cos 5.17e-5 against a bound of
  // 3.19e-5, argmax 6 against 5), 1349778677632993227 (argmax 4 against 3) and 0 failed it on
  // unchanged GPU bits.
  ref::RefOptions rob{blocks, 0};
  rob.cache.kv_dtype = rob.cache.ik_dtype = DType::BF16;
  auto ref_b = ref::make_ref_backend(spec, m.deq, rob);
  // the yardstick: that reference with each (1 + input_norm) scaled by 1 +- 2^-9 (one bf16
  // rounding), kYard independent draws of the signs; the gates use the draws' mean (the expectation
  // of one draw, a quarter of its variance)
  constexpr int kYard = 4;
  std::vector<std::unique_ptr<Backend>> yard_refs;
  for (int d = 0; d < kYard; ++d) {
    ModelWeights p = m.deq;
    for (auto& L : p.layers)
      for (auto& x : L.input_norm) x = (1 + x) * (1 + ((rng() & 1) ? 1 : -1) * 0x1p-9f) - 1;
    yard_refs.push_back(ref::make_ref_backend(spec, std::move(p), rob));
  }
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  auto gpu = native::make_cuda_backend(m.pw, o);
  native::CudaBackendOptions os = o;  // small passes: the 127-token step runs in 6 chunks
  os.max_tokens = 24;
  os.max_graph_batch = 16;
  os.kv_dtype = os.ik_dtype = DType::BF16;  // and BF16 caches
  auto gpu_small = native::make_cuda_backend(m.pw, os);
  for (auto* g : {gpu.get(), gpu_small.get()}) g->kv_cache().fill(0x7f, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());

  auto perm = shuffled_blocks(blocks, rng);
  std::vector<uint8_t> used(size_t(blocks), 0);
  std::vector<SeqState> S(3);
  const int nblk[3] = {8, 10, 4};
  int at = 0;
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < nblk[i]; ++b) {
      S[size_t(i)].table.push_back(perm[size_t(at)]);
      used[size_t(perm[size_t(at++)])] = 1;
    }
  S[0].prompt = random_ids(90, V, rng);  // > 4 blocks of 16: sparse selection
  S[1].prompt = random_ids(70, V, rng);
  S[2].prompt = random_ids(20, V, rng);

  LogitsStats st[2], yard[kYard];
  SelectionStats sel[2], yard_sel[kYard];
  double near_tie_margin[2] = {0, 0};  // largest reference margin at an argmax difference, / max|ref|
  auto run = [&](const StepBatch& b, bool traced) {
    SelectionTrace rt, rbt, gt[2];
    native::BlockScoreTrace sc[2];
    StepOutput r = ref->step(b, traced ? &rt : nullptr);
    StepOutput rb = ref_b->step(b, traced ? &rbt : nullptr);
    for (int d = 0; d < kYard; ++d) {
      SelectionTrace yt;
      StepOutput y = yard_refs[size_t(d)]->step(b, traced ? &yt : nullptr);
      for (size_t row = 0; row < rb.logits.size() / size_t(V); ++row)
        yard[d].add(y.logits.data() + row * V, rb.logits.data() + row * V, V, "yardstick row " + std::to_string(row));
      if (traced) {
        SelectionStats ys = compare_selections(yt, rbt, nullptr, 0);
        yard_sel[d].rows += ys.rows;
        yard_sel[d].differ += ys.differ;
      }
    }
    native::CudaBackend* gs[2] = {gpu.get(), gpu_small.get()};
    for (int k = 0; k < 2; ++k) {
      gs[k]->set_block_score_trace(traced ? &sc[k] : nullptr);
      StepOutput g = gs[k]->step(b, traced ? &gt[k] : nullptr);
      EXPECT_EQ(g.first_row, r.first_row);
      EXPECT_EQ(g.num_rows, r.num_rows);
      if (g.logits.size() != r.logits.size()) {
        ADD_FAILURE() << "logits sizes differ: " << g.logits.size() << " vs " << r.logits.size();
        continue;
      }
      const StepOutput& rk = k ? rb : r;  // each backend against the reference of its caches
      const int rows = int(rk.logits.size() / size_t(V));
      for (int row = 0; row < rows; ++row) {
        const float* gr = g.logits.data() + size_t(row) * V;
        const float* rr = rk.logits.data() + size_t(row) * V;
        const int before = st[k].argmax_diff;
        st[k].add(gr, rr, V, "step row " + std::to_string(row));
        if (st[k].argmax_diff != before) {
          double mx = 0;
          for (int v = 0; v < V; ++v) mx = std::max(mx, double(std::fabs(rr[v])));
          near_tie_margin[k] = std::max(near_tie_margin[k], top1_margin(rr, V) / mx);
        }
      }
      if (traced) {
        SelectionStats s = compare_selections(gt[k], k ? rbt : rt, &sc[k], 0.03);
        sel[k].rows += s.rows;
        sel[k].differ += s.differ;
        sel[k].near_ties += s.near_ties;
        sel[k].real += s.real;
        sel[k].worst_gap = std::max(sel[k].worst_gap, s.worst_gap);
        if (sel[k].first_real.empty()) sel[k].first_real = s.first_real;
      }
    }
    return r;
  };
  auto last_token = [&](const StepOutput& r, int seq) { return int32_t(argmax_of(r.row(seq, r.num_rows[size_t(seq)] - 1), V)); };

  // 1: two prefills (one all-logits), traced
  {
    std::vector<int32_t> b_head(S[1].prompt.begin(), S[1].prompt.begin() + 37);
    StepBatch b{{SeqStep{0, S[0].prompt, S[0].table, false}, SeqStep{0, b_head, S[1].table, true}}};
    StepOutput r = run(b, true);
    S[0].pos = 90;
    S[0].next = last_token(r, 0);
    S[1].pos = 37;
  }
  // 2: mixed: the rest of B's prompt, one decode row of A, C's whole prompt with all logits
  {
    std::vector<int32_t> b_tail(S[1].prompt.begin() + 37, S[1].prompt.end());
    StepBatch b{{SeqStep{S[1].pos, b_tail, S[1].table, false}, SeqStep{S[0].pos, {S[0].next}, S[0].table, false},
                 SeqStep{0, S[2].prompt, S[2].table, true}}};
    StepOutput r = run(b, false);
    S[1].pos = 70;
    S[1].next = last_token(r, 0);
    S[0].pos += 1;
    S[0].next = last_token(r, 1);
    S[2].pos = 20;
    S[2].next = last_token(r, 2);
  }
  // 3..: decode buckets of 3 (padded to 4), 1, 2 sequences
  auto decode = [&](std::vector<int> who) {
    StepBatch b;
    for (int i : who) b.seqs.push_back(SeqStep{S[size_t(i)].pos, {S[size_t(i)].next}, S[size_t(i)].table, false});
    StepOutput r = run(b, false);
    for (size_t j = 0; j < who.size(); ++j) {
      S[size_t(who[j])].pos += 1;
      S[size_t(who[j])].next = last_token(r, int(j));
    }
  };
  for (int s = 0; s < 10; ++s) decode({0, 1, 2});
  decode({1});
  decode({2, 0});
  decode({0, 1, 2});

  for (int k = 0; k < 2; ++k) {
    const char* name = k ? "bf16 caches, max_tokens 24, vs the reference with bf16 caches" : "default";
    std::printf("  [%s] %d logits rows: cosine min %.6f median %.7f, max|d|/max|ref| %.3g, argmax differences %d "
                "(largest reference margin there %.3g of max|logit|) %s\n",
                name, st[k].rows, st[k].min_cos, st[k].median_cos(), st[k].max_rel, st[k].argmax_diff,
                near_tie_margin[k], st[k].first_diff.c_str());
    std::printf("  [%s] selections: %lld rows, %lld differ (%lld near-ties, %lld other), worst gap %.3g\n", name,
                (long long)sel[k].rows, (long long)sel[k].differ, (long long)sel[k].near_ties, (long long)sel[k].real,
                sel[k].worst_gap);
    EXPECT_GT(sel[k].rows, 0);
  }
  auto below = [](const LogitsStats& x) {
    return int(std::count_if(x.cos.begin(), x.cos.end(), [](double c) { return c < 0.999; }));
  };
  // the yardstick's statistics: each draw's, and their means
  double y_med = 0, y_below = 0, y_argmax = 0, y_sel = 0;
  for (int d = 0; d < kYard; ++d) {
    std::printf("  [yardstick %d: CPU ref with bf16 caches, norms perturbed by 2^-9] %d rows: cosine min %.6f median %.7f, rows < "
                "0.999: %d, argmax differences %d; selections %lld rows, %lld differ\n",
                d, yard[d].rows, yard[d].min_cos, yard[d].median_cos(), below(yard[d]), yard[d].argmax_diff,
                (long long)yard_sel[d].rows, (long long)yard_sel[d].differ);
    y_med += (1 - yard[d].median_cos()) / kYard;
    y_below += double(below(yard[d])) / kYard;
    y_argmax += double(yard[d].argmax_diff) / kYard;
    y_sel += double(yard_sel[d].differ) / kYard;
  }
  std::printf("  [yardstick, mean of %d draws] 1 - median cosine %.3g, rows < 0.999 %.2f, argmax differences %.2f, "
              "selections differing %.2f\n",
              kYard, y_med, y_below, y_argmax, y_sel);
  // NOTE: same dequantized weights. The BF16-cache variant against the reference with the same
  // cache rounding leaves accumulation order; a random tiny MoE amplifies any rounding (router and block top-k near-ties), so the
  // gate is the reference's own spread under a rounding-sized perturbation (test_model_vs_ref.cpp
  // says more): at most 2x its 1 - median cosine, rows under 0.999, argmax and selection
  // differences, plus a small allowance. The default variant adds FP8 caches and bf16-rounded
  // activations in passes of more than 16 rows: sanity bounds (measured on the H200, 2026-11-30,
  // seed 12345: median 0.99907, worst row 0.90).
  EXPECT_LE(1 - st[1].median_cos(), 2 * y_med + 1e-6);
  // and on its own: with the caches rounded alike only the order of fp32 sums differs, ~1e-6
  // relative per logit, so the median row is within 1e-5 of cosine 1 (measured on the H200,
  // 2026-12-02, 10 seeds: median cos printed 0.9999999-1.0000000; the rows a flipped selection moves are few)
  EXPECT_LE(1 - st[1].median_cos(), 1e-5);
  EXPECT_LE(double(below(st[1])), 2 * y_below + 2) << st[1].first_diff;
  EXPECT_LE(double(st[1].argmax_diff), 2 * y_argmax + 1) << st[1].first_diff;
  EXPECT_LE(double(sel[1].differ), 2.0 * y_sel + 0.002 * double(sel[1].rows)) << sel[1].first_real;
  EXPECT_GE(st[0].median_cos(), 0.99);
  EXPECT_GE(st[0].min_cos, 0.8) << st[0].first_diff;
  auto stats = gpu->stats();
  EXPECT_GT(stats.graph_replays, 0);
  EXPECT_EQ(gpu_small->stats().eager_passes, 6 + 3);  // passes of <= 24 rows: 127 tokens, then 54
  for (auto* g : {gpu.get(), gpu_small.get()}) expect_untouched(*g, used, 0x7f);
}

TEST(GpuCudaBackend, GraphReplayIsBitwiseEagerAndTablesDoNotMatter) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int blocks = 160, V = spec.vocab_size, nseq = 40, per = 3;
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  auto graph = native::make_cuda_backend(m.pw, o);
  native::CudaBackendOptions oe = o;
  oe.cuda_graphs = false;
  auto eager = native::make_cuda_backend(m.pw, oe);
  auto shuf = native::make_cuda_backend(m.pw, o);
  // the norms' prep half as ops in every plan (M3_FUSED_NORMS=0), instead of fused into the O
  // projection and the MoE combine in decode plans, and the projections splitting their fp32
  // activations themselves (M3_SPLIT_ACT=0) instead of reading them split by their producers: the
  // same bits (kernels/fused_norm_params.h, kernels/act_split.cuh); and the top-k and the route as
  // ops of their own (M3_FUSED_TOPK=0, M3_ROUTE_LAST=0), and the rope after the qkv projection
  // (M3_ROPE_LAST) and the combine after the down projection (M3_COMBINE_LAST), both off by default:
  // the fused backends turn them on here
  auto unfused = native::make_cuda_backend(m.pw, oe);
  for (auto* b : {graph.get(), eager.get(), shuf.get(), unfused.get()}) b->kv_cache().fill(0x7f, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());

  // Tables: sequences take blocks from two different random permutations (shuf uses the second).
  auto p1 = shuffled_blocks(blocks, rng), p2 = shuffled_blocks(blocks, rng);
  std::vector<uint8_t> used1(size_t(blocks), 0), used2(size_t(blocks), 0);
  std::vector<SeqState> S(static_cast<size_t>(nseq)), S2;
  std::uniform_int_distribution<int> len(3, 30);
  for (int i = 0; i < nseq; ++i) {
    for (int b = 0; b < per; ++b) {
      S[size_t(i)].table.push_back(p1[size_t(i * per + b)]);
      used1[size_t(p1[size_t(i * per + b)])] = 1;
    }
    S[size_t(i)].prompt = random_ids(len(rng), V, rng);
  }
  S2 = S;
  for (int i = 0; i < nseq; ++i)
    for (int b = 0; b < per; ++b) {
      S2[size_t(i)].table[size_t(b)] = p2[size_t(i * per + b)];
      used2[size_t(p2[size_t(i * per + b)])] = 1;
    }

  int64_t compared = 0, differ_graph = 0, differ_shuf = 0, differ_unfused = 0, nonfinite = 0;
  auto run = [&](const StepBatch& b1, const StepBatch& b2) {
    // every fusion on for the three (whatever the environment says), off for unfused
    auto fusions = [](int on) {
      native::set_fused_norms(on);
      native::set_split_activations(on);
      native::set_fused_topk(on);
      native::set_router_gemv_route(on);
      native::set_mma_rope(on);
      native::set_moe_down_combine(on);
    };
    fusions(1);
    StepOutput e = eager->step(b1);
    StepOutput g = graph->step(b1);
    StepOutput s = shuf->step(b2);
    fusions(0);
    StepOutput u = unfused->step(b1);
    fusions(-1);
    EXPECT_EQ(e.logits.size(), g.logits.size());
    EXPECT_EQ(e.logits.size(), s.logits.size());
    EXPECT_EQ(e.logits.size(), u.logits.size());
    compared += int64_t(e.logits.size());
    for (size_t i = 0; i < e.logits.size() && i < g.logits.size() && i < s.logits.size() && i < u.logits.size(); ++i) {
      differ_graph += std::memcmp(&e.logits[i], &g.logits[i], 4) != 0;
      differ_shuf += std::memcmp(&e.logits[i], &s.logits[i], 4) != 0;
      differ_unfused += std::memcmp(&e.logits[i], &u.logits[i], 4) != 0;
      nonfinite += !std::isfinite(e.logits[i]);
    }
    return e;
  };
  {  // one prefill step for all 40 sequences
    StepBatch b1, b2;
    for (int i = 0; i < nseq; ++i) {
      b1.seqs.push_back(SeqStep{0, S[size_t(i)].prompt, S[size_t(i)].table, false});
      b2.seqs.push_back(SeqStep{0, S[size_t(i)].prompt, S2[size_t(i)].table, false});
    }
    StepOutput e = run(b1, b2);
    for (int i = 0; i < nseq; ++i) {
      S[size_t(i)].pos = int(S[size_t(i)].prompt.size());
      S[size_t(i)].next = int32_t(argmax_of(e.row(i), V));
    }
  }
  // decode steps of many sizes (buckets 64, 1, 2, 4, 8, 16, 32, and repeats that replay graphs)
  std::vector<int> order(static_cast<size_t>(nseq));
  std::iota(order.begin(), order.end(), 0);
  for (int n : {40, 1, 2, 3, 5, 9, 17, 33, 40, 7, 3, 5, 2, 1, 17}) {
    std::shuffle(order.begin(), order.end(), rng);
    StepBatch b1, b2;
    for (int j = 0; j < n; ++j) {
      const int i = order[size_t(j)];
      b1.seqs.push_back(SeqStep{S[size_t(i)].pos, {S[size_t(i)].next}, S[size_t(i)].table, false});
      b2.seqs.push_back(SeqStep{S[size_t(i)].pos, {S[size_t(i)].next}, S2[size_t(i)].table, false});
    }
    StepOutput e = run(b1, b2);
    for (int j = 0; j < n; ++j) {
      const int i = order[size_t(j)];
      S[size_t(i)].pos += 1;
      S[size_t(i)].next = int32_t(argmax_of(e.row(j), V));
    }
  }
  std::printf("  %lld logits compared: graph vs eager %lld differ, shuffled tables vs eager %lld differ, "
              "unfused norms, unsplit activations vs eager %lld differ; graph backend: %lld captures, %lld replays\n",
              (long long)compared, (long long)differ_graph, (long long)differ_shuf, (long long)differ_unfused,
              (long long)graph->stats().graph_captures, (long long)graph->stats().graph_replays);
  EXPECT_EQ(nonfinite, 0) << "non-finite logits (a read of a poisoned, unwritten cache slot?)";
  EXPECT_EQ(differ_graph, 0);
  EXPECT_EQ(differ_shuf, 0);
  EXPECT_EQ(differ_unfused, 0);
  EXPECT_EQ(graph->stats().graph_captures, 7);  // buckets 1, 2, 4, 8, 16, 32, 64
  EXPECT_GE(graph->stats().graph_replays, 5);
  EXPECT_EQ(eager->stats().graph_replays, 0);
  expect_untouched(*graph, used1, 0x7f);
  expect_untouched(*eager, used1, 0x7f);
  expect_untouched(*shuf, used2, 0x7f);
  // graph and eager wrote the same bytes into the same slots
  size_t cache_diff = 0;
  auto count_diff = [&](const void* x, const void* y, size_t n) {
    auto a = download(x, n), b = download(y, n);
    for (size_t i = 0; i < n; ++i) cache_diff += a[i] != b[i];
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    auto a = graph->kv_cache().layer(l), b = eager->kv_cache().layer(l);
    const auto& sh = graph->kv_cache().shape();
    count_diff(a.k, b.k, sh.kv_bytes());
    count_diff(a.v, b.v, sh.kv_bytes());
    if (a.ik) count_diff(a.ik, b.ik, sh.ik_bytes());
  }
  EXPECT_EQ(cache_diff, 0u) << "cache bytes differ between graph replay and eager";
}

TEST(GpuCudaBackend, MalformedStepsThrowAndLeaveTheBackendUsable) {
  ModelSpec spec = synthetic_preset("tiny");
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, SyntheticOptions{}));
  native::CudaBackendOptions o;
  o.num_cache_blocks = 8;
  auto g = native::make_cuda_backend(m.pw, o);
  const std::vector<int32_t> t{3, 5, 7};
  EXPECT_THROW(g->step(StepBatch{}), Error);
  EXPECT_THROW(g->step(StepBatch{{SeqStep{0, {1, 2, 1024}, t, false}}}), Error);  // id outside the vocabulary
  EXPECT_THROW(g->step(StepBatch{{SeqStep{0, {1, 2}, {8}, false}}}), Error);       // block id outside the pool
  EXPECT_THROW(g->step(StepBatch{{SeqStep{20, {1}, {0}, false}}}), Error);         // table too short
  EXPECT_THROW(g->step(StepBatch{{SeqStep{5, {1}, t, false}}}), Error);            // history never written
  EXPECT_THROW(g->step(StepBatch{{SeqStep{0, {1}, t, false}, SeqStep{0, {2}, t, false}}}), Error);  // one slot twice
  EXPECT_THROW(g->step(StepBatch{{SeqStep{0, {}, t, false}}}), Error);
  // still usable: a prompt, then a decode step over it
  StepOutput a = g->step(StepBatch{{SeqStep{0, {1, 2, 3, 4}, t, false}}});
  StepOutput b = g->step(StepBatch{{SeqStep{4, {5}, t, false}}});
  for (float v : a.logits) ASSERT_TRUE(std::isfinite(v));
  for (float v : b.logits) ASSERT_TRUE(std::isfinite(v));
  // a table that disagrees with what was written is refused
  EXPECT_THROW(g->step(StepBatch{{SeqStep{5, {6}, {4, 5, 6}, false}}}), Error);
  // a new prompt must not overwrite history another sequence of the step reads
  EXPECT_THROW(g->step(StepBatch{{SeqStep{5, {6}, t, false}, SeqStep{0, {9}, t, false}}}), Error);
}
