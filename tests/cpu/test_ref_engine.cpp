// The reference engine as a whole: against an independent float64 model (tests/common/naive_model)
// on random shapes, and its cache/batching invariants, which must hold bitwise because every
// output element is computed by one fixed-order loop: prefill-then-decode = one forward, chunked
// prefill = one prefill, shuffled block tables, several sequences in one step = each alone, thread
// count 1 = 2 = 3. MSA edges (context within one block, block boundaries, fewer blocks than top-k
// = dense attention, two local blocks) and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/compare.h"
#include "common/naive_model.h"
#include "common/random.h"
#include "core/check.h"
#include "ref/engine.h"

using namespace m3;
using m3::test::fresh_seed;

namespace {

int rint(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::unique_ptr<Backend> backend(const ModelSpec& s, const ModelWeights& w, int threads = 2, int blocks = 64) {
  return ref::make_ref_backend(s, w, ref::RefOptions{blocks, threads});
}

// A block table of `n` distinct physical blocks drawn from [0, pool) (identity when rng is null).
std::vector<int32_t> table(int n, int pool, std::mt19937_64* rng) {
  std::vector<int32_t> t(static_cast<size_t>(pool));
  std::iota(t.begin(), t.end(), 0);
  if (rng) std::shuffle(t.begin(), t.end(), *rng);
  t.resize(static_cast<size_t>(n));
  return t;
}

// Feeds `tokens` through the backend in chunks of the given sizes; returns the logits of every
// token (rows concatenated) and the selection trace of every token (per sparse layer).
struct SeqRun {
  std::vector<float> logits;
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> blocks;  // [sparse layer][token][group]
};
SeqRun run_chunks(Backend& b, const std::vector<int32_t>& tokens, const std::vector<int>& chunks,
               const std::vector<int32_t>& tbl) {
  SeqRun r;
  int pos = 0;
  for (int c : chunks) {
    StepBatch batch;
    SeqStep& s = batch.seqs.emplace_back();
    s.start_pos = pos;
    s.tokens.assign(tokens.begin() + pos, tokens.begin() + pos + c);
    s.block_table = tbl;
    s.all_logits = true;
    SelectionTrace tr;
    StepOutput out = b.step(batch, &tr);
    EXPECT_EQ(out.num_rows, std::vector<int>{c});
    r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
    if (r.blocks.empty()) r.blocks.resize(tr.blocks.size());
    for (size_t l = 0; l < tr.blocks.size(); ++l)
      r.blocks[l].insert(r.blocks[l].end(), tr.blocks[l].begin(), tr.blocks[l].end());
    pos += c;
  }
  return r;
}

std::vector<int> random_chunks(int total, std::mt19937_64& rng) {
  std::vector<int> c;
  while (total > 0) {
    int n = std::min(total, rint(rng, 1, 9));
    c.push_back(n);
    total -= n;
  }
  return c;
}

int blocks_for(const ModelSpec& s, int tokens) { return (tokens + s.index_block - 1) / s.index_block; }

}  // namespace

TEST(RefEngine, MatchesNaiveFp64ModelOnRandomShapes) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int done = 0;
  double worst = 0;
  for (int attempt = 0; attempt < 60 && done < 10; ++attempt) {
    ModelSpec s = m3::test::random_spec(rng);
    ModelWeights w = m3::test::make_random_weights(s, rng());
    int T = rint(rng, 1, (s.index_topk + 4) * s.index_block);
    auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
    auto ref = m3::test::naive_forward(s, w, toks);
    // fp32 activations may legitimately decide a near-tie differently from fp64: skip such draws
    if (ref.min_block_gap < 1e-4 || ref.min_router_gap < 1e-5) continue;
    ++done;
    auto b = backend(s, w, 2, blocks_for(s, T) + 3);
    SeqRun got = run_chunks(*b, toks, {T}, table(blocks_for(s, T), blocks_for(s, T) + 3, &rng));
    ASSERT_EQ(got.blocks, ref.blocks) << "indexer selections differ from the fp64 model";
    for (int t = 0; t < T; ++t) {
      std::span<const float> g(got.logits.data() + size_t(t) * s.vocab_size, size_t(s.vocab_size));
      std::vector<float> r(ref.logits.begin() + ptrdiff_t(size_t(t) * s.vocab_size),
                           ref.logits.begin() + ptrdiff_t(size_t(t + 1) * s.vocab_size));
      double mx = 0;
      for (float v : r) mx = std::max(mx, double(std::fabs(v)));
      auto c = m3::test::compare(g, r, 3e-6 * mx, 0.0);
      worst = std::max(worst, c.max_abs_err / mx);
      // fp32 activations between ops (6e-8 relative each) through a few layers; measured worst
      // about 2e-7 of the row's max |logit|, bound 3e-6 (the golden bound is 1e-3)
      EXPECT_TRUE(c.ok) << "token " << t << ": " << c.describe();
    }
  }
  EXPECT_GE(done, 5) << "too many draws skipped for near ties";
  std::printf("naive fp64 model: %d random shapes, worst max|d|/max|ref| per row %.3g\n", done, worst);
}

TEST(RefEngine, PrefillThenDecodeEqualsOneForward) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  int T = rint(rng, 20, 48), m = rint(rng, 1, T - 1);
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  auto tbl = table(blocks_for(s, T), 64, nullptr);
  auto full = run_chunks(*backend(s, w), toks, {T}, tbl);
  std::vector<int> chunks{m};
  chunks.resize(size_t(1 + T - m), 1);
  auto inc = run_chunks(*backend(s, w), toks, chunks, tbl);
  EXPECT_EQ(inc.logits, full.logits) << "prefill " << m << " then decode differs from one forward of " << T;
  EXPECT_EQ(inc.blocks, full.blocks);
}

TEST(RefEngine, ChunkedPrefillEqualsOnePrefill) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::random_spec(rng);
  ModelWeights w = m3::test::make_random_weights(s, rng());
  int T = rint(rng, 2, 6 * s.index_block);
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  auto tbl = table(blocks_for(s, T), 64, nullptr);
  auto one = run_chunks(*backend(s, w), toks, {T}, tbl);
  auto chunks = random_chunks(T, rng);
  auto many = run_chunks(*backend(s, w), toks, chunks, tbl);
  EXPECT_EQ(many.logits, one.logits) << chunks.size() << " chunks";
  EXPECT_EQ(many.blocks, one.blocks);
}

TEST(RefEngine, ShuffledBlockTableIsBitwiseIdentical) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  int T = rint(rng, 10, 60);
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  auto chunks = random_chunks(T, rng);
  auto a = run_chunks(*backend(s, w), toks, chunks, table(blocks_for(s, T), 64, nullptr));
  auto b = run_chunks(*backend(s, w), toks, chunks, table(blocks_for(s, T), 64, &rng));
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.blocks, b.blocks);
}

TEST(RefEngine, SeveralSequencesInOneStepEqualEachAlone) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  const int S = 3;
  std::vector<std::vector<int32_t>> toks(S), tbls(S);
  std::vector<int> prefix(S), len(S);
  auto pool = table(64, 64, &rng);  // disjoint physical blocks for the three sequences
  for (int i = 0; i < S; ++i) {
    len[size_t(i)] = rint(rng, 2, 40);
    prefix[size_t(i)] = rint(rng, 0, len[size_t(i)] - 1);  // 0: the sequence starts in the joint step
    toks[size_t(i)] = m3::test::random_tokens(len[size_t(i)], s.vocab_size, rng);
    tbls[size_t(i)].assign(pool.begin() + 16 * i, pool.begin() + 16 * i + blocks_for(s, len[size_t(i)]));
  }
  // alone: each sequence in its own backend, prefix then the rest in one chunk
  std::vector<SeqRun> alone;
  for (int i = 0; i < S; ++i) {
    std::vector<int> ch;
    if (prefix[size_t(i)] > 0) ch.push_back(prefix[size_t(i)]);
    ch.push_back(len[size_t(i)] - prefix[size_t(i)]);
    alone.push_back(run_chunks(*backend(s, w), toks[size_t(i)], ch, tbls[size_t(i)]));
  }
  // together: prefixes each alone, then one step holding the rest of all three (mixed prefill and
  // decode, alternating all_logits)
  auto b = backend(s, w, 3);
  for (int i = 0; i < S; ++i)
    if (prefix[size_t(i)] > 0) run_chunks(*b, toks[size_t(i)], {prefix[size_t(i)]}, tbls[size_t(i)]);
  StepBatch batch;
  for (int i = 0; i < S; ++i) {
    SeqStep& q = batch.seqs.emplace_back();
    q.start_pos = prefix[size_t(i)];
    q.tokens.assign(toks[size_t(i)].begin() + prefix[size_t(i)], toks[size_t(i)].end());
    q.block_table = tbls[size_t(i)];
    q.all_logits = i != 1;
  }
  StepOutput out = b->step(batch);
  for (int i = 0; i < S; ++i) {
    int n = len[size_t(i)] - prefix[size_t(i)];
    ASSERT_EQ(out.num_rows[size_t(i)], i != 1 ? n : 1);
    int skip = i != 1 ? 0 : n - 1;  // only the last row when all_logits is off
    for (int r = 0; r < out.num_rows[size_t(i)]; ++r) {
      const float* got = out.row(i, r);
      const float* want = alone[size_t(i)].logits.data() + size_t(prefix[size_t(i)] + skip + r) * s.vocab_size;
      EXPECT_TRUE(std::equal(got, got + s.vocab_size, want)) << "sequence " << i << " row " << r;
    }
  }
}

TEST(RefEngine, ThreadCountIndependence) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  int T = rint(rng, 20, 50);
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  auto tbl = table(blocks_for(s, T), 64, nullptr);
  auto chunks = random_chunks(T, rng);
  auto r1 = run_chunks(*backend(s, w, 1), toks, chunks, tbl);
  auto r2 = run_chunks(*backend(s, w, 2), toks, chunks, tbl);
  auto r3 = run_chunks(*backend(s, w, 3), toks, chunks, tbl);
  EXPECT_EQ(r1.logits, r2.logits);
  EXPECT_EQ(r1.logits, r3.logits);
  EXPECT_EQ(r1.blocks, r2.blocks);
}

TEST(RefEngine, MsaEdges) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();  // block 4, top-3
  ModelWeights w = m3::test::make_random_weights(s, rng());
  // a dense twin: the same layers with full attention (index weights unused)
  ModelSpec d = s;
  for (auto& a : d.attn) a = AttnKind::Full;
  ModelWeights wd = w;
  for (auto& L : wd.layers) L.wiq = L.wik = Mat(), L.iq_norm = L.ik_norm = Vec();
  // within one block, exactly top-k blocks (on a boundary), and fewer blocks than top-k: MSA selects
  // every block, so it must equal dense attention bitwise (same keys in the same order)
  for (int T : {1, 3, s.index_block, 2 * s.index_block + 1, s.index_topk * s.index_block}) {
    auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
    auto tbl = table(blocks_for(s, T), 64, &rng);
    auto chunks = random_chunks(T, rng);
    auto sp = run_chunks(*backend(s, w), toks, chunks, tbl);
    auto de = run_chunks(*backend(d, wd), toks, chunks, tbl);
    EXPECT_EQ(sp.logits, de.logits) << "T " << T;
    for (int t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(t / s.index_block + 1));
      std::iota(all.begin(), all.end(), 0);
      for (auto& layer : sp.blocks)
        for (auto& grp : layer[size_t(t)]) EXPECT_EQ(grp, all) << "token " << t;
    }
  }
  // one token past top-k blocks: the selection is now sparse and differs from dense
  int T = s.index_topk * s.index_block + 1;
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  auto tbl = table(blocks_for(s, T), 64, nullptr);
  auto sp = run_chunks(*backend(s, w), toks, {T}, tbl);
  auto de = run_chunks(*backend(d, wd), toks, {T}, tbl);
  EXPECT_NE(sp.logits, de.logits);
  for (auto& layer : sp.blocks)
    for (auto& grp : layer[size_t(T - 1)]) {
      EXPECT_EQ(int(grp.size()), s.index_topk);
      EXPECT_EQ(grp.back(), (T - 1) / s.index_block) << "the query's own block is always kept";
    }
}

TEST(RefEngine, TwoLocalBlocksAgainstNaive) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  s.index_local = 2;
  s.index_topk = 3;
  for (int attempt = 0; attempt < 10; ++attempt) {
    ModelWeights w = m3::test::make_random_weights(s, rng());
    int T = 9 * s.index_block;
    auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
    auto ref = m3::test::naive_forward(s, w, toks);
    if (ref.min_block_gap < 1e-4 || ref.min_router_gap < 1e-5) continue;
    auto got = run_chunks(*backend(s, w), toks, random_chunks(T, rng), table(blocks_for(s, T), 64, &rng));
    EXPECT_EQ(got.blocks, ref.blocks);
    for (auto& layer : got.blocks)
      for (int t = 0; t < T; ++t)
        for (auto& grp : layer[size_t(t)]) {
          int qb = t / s.index_block;
          EXPECT_TRUE(std::find(grp.begin(), grp.end(), qb) != grp.end());
          if (qb > 0) {
            EXPECT_TRUE(std::find(grp.begin(), grp.end(), qb - 1) != grp.end()) << "token " << t;
          }
        }
    std::vector<float> r(ref.logits.begin(), ref.logits.end());
    EXPECT_CLOSE(got.logits, r, 1e-4, 0.0);  // logits ~1; fp32 activations vs fp64 (see above)
    return;
  }
  FAIL() << "every draw had a near tie";
}

TEST(RefEngine, TraceLayout) {
  uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  auto b = backend(s, m3::test::make_random_weights(s, rng()));
  StepBatch batch;
  for (int i = 0; i < 2; ++i) {
    SeqStep& q = batch.seqs.emplace_back();
    q.tokens = m3::test::random_tokens(5 + i, s.vocab_size, rng);
    q.block_table = {2 * i, 2 * i + 1};
  }
  SelectionTrace tr;
  StepOutput out = b->step(batch, &tr);
  EXPECT_EQ(tr.layers, (std::vector<int>{1, 2}));
  ASSERT_EQ(tr.blocks.size(), 2u);
  EXPECT_EQ(tr.blocks[0].size(), 11u);  // tokens of both sequences in batch order
  EXPECT_EQ(tr.blocks[0][10].size(), size_t(s.num_kv_heads));
  EXPECT_EQ(tr.blocks[0][10][0], (std::vector<int32_t>{0, 1}));  // position 5 of sequence 1
  EXPECT_EQ(out.first_row, (std::vector<int>{0, 1}));
  EXPECT_EQ(out.logits.size(), size_t(2 * s.vocab_size));
  for (float v : out.logits) ASSERT_TRUE(std::isfinite(v));
}

namespace {
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "expected \"" << needle << "\" in: " << e.what();
  }
}
}  // namespace

TEST(RefEngine, RejectsBadInput) {
  std::mt19937_64 rng(fresh_seed());
  ModelSpec s = m3::test::small_spec();
  s.max_positions = 40;
  ModelWeights w = m3::test::make_random_weights(s, rng());
  auto b = backend(s, w, 2, 8);
  auto one = [&](int start, std::vector<int32_t> toks, std::vector<int32_t> tbl) {
    StepBatch batch;
    batch.seqs.push_back(SeqStep{start, std::move(toks), std::move(tbl), false});
    return [&b, batch] { b->step(batch); };
  };
  expect_error([&] { b->step(StepBatch{}); }, "no sequences");
  expect_error(one(0, {}, {0}), "has no tokens");
  expect_error(one(0, {1, s.vocab_size}, {0}), "outside the vocabulary");
  expect_error(one(0, {1, -1}, {0}), "outside the vocabulary");
  expect_error(one(0, {1, 2, 3, 4, 5}, {0}), "its block table has 1");
  expect_error(one(0, {1, 2}, {8}), "outside [0, 8)");
  expect_error(one(-1, {1}, {0}), "start_pos -1");
  expect_error(one(39, {1, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 0, 1}), "max_position_embeddings is 40");
  expect_error(one(3, {1}, {0}), "holds nothing");  // history never written
  b->step(StepBatch{{SeqStep{0, {1, 2, 3}, {5}, false}}});
  expect_error(one(3, {1}, {6}), "does not match");  // wrong block for the history
  b->step(StepBatch{{SeqStep{3, {4}, {5}, false}}});  // the right one works
  StepBatch clash{{SeqStep{0, {1}, {2}, false}, SeqStep{0, {1}, {2}, false}}};
  expect_error([&] { b->step(clash); }, "both write cache slot");
  StepBatch over{{SeqStep{4, {1}, {5, 6}, false}, SeqStep{0, {1, 2}, {5}, false}}};
  expect_error([&] { b->step(over); }, "which holds position 0");
  // weights that do not match the spec name the tensor
  ModelWeights bad = w;
  bad.layers[1].wik = Mat(3, s.hidden);
  expect_error([&] { backend(s, bad); }, "layers.1.self_attn.index_k_proj");
  ModelSpec bs = s;
  bs.index_heads = 1;
  expect_error([&] { backend(bs, w); }, "index_n_heads");
}
