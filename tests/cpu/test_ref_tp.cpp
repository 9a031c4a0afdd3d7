// The CPU reference with tensor parallelism (ranks as threads; model/tp_shard.h, RefOptions::tp):
//  - the ranks' slices put back together are the full weights (every tensor, every element);
//  - TP 2 and TP 4 against TP 1 on a fresh random model (KV heads divisible by 4): prefill and
//    decode logits within a stated bound, greedy ids equal wherever TP 1's top-2 margin is above it,
//    and the merged selection trace (blocks of every KV group, experts, cache entries) equal;
//  - the golden fixtures pass conformance at TP 2 (bound 1e-3, as at TP 1);
//  - a split that does not divide names the dimension.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/load_weights.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/tp_shard.h"
#include "model/weight_table.h"
#include "ref/conformance.h"
#include "ref/engine.h"
#include "ref/golden.h"

using namespace m3;
namespace fs = std::filesystem;

namespace {

ModelSpec tp4_spec() {  // tiny with 4 KV (and index) heads, so 4 ranks divide every split
  ModelSpec s = synthetic_preset("tiny");
  s.num_kv_heads = 4;
  s.index_heads = 4;
  s.validate("tp test");
  return s;
}

StepBatch one_seq(const std::vector<int32_t>& toks, int done, int blocks, bool all_logits) {
  StepBatch b;
  SeqStep st;
  st.start_pos = done;
  st.tokens = toks;
  for (int i = 0; i < blocks; ++i) st.block_table.push_back(i);
  st.all_logits = all_logits;
  b.seqs.push_back(st);
  return b;
}

// max over rows of max|a - b| / max|a| of the row
double worst_rel(const StepOutput& a, const StepOutput& b, int* row = nullptr) {
  double worst = 0;
  const int rows = int(a.logits.size() / size_t(a.vocab));
  for (int r = 0; r < rows; ++r) {
    double m = 0, d = 0;
    for (int v = 0; v < a.vocab; ++v) {
      m = std::max(m, double(std::fabs(a.logits[size_t(r) * a.vocab + v])));
      d = std::max(d, double(std::fabs(a.logits[size_t(r) * a.vocab + v] - b.logits[size_t(r) * a.vocab + v])));
    }
    const double rel = m > 0 ? d / m : d;
    if (!(rel <= worst)) {
      worst = std::isnan(rel) ? INFINITY : rel;
      if (row) *row = r;
    }
  }
  return worst;
}

}  // namespace

TEST(RefTp, RankSlicesReassembleTheWeights) {
  const ModelSpec spec = tp4_spec();
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  const ModelWeights w = synthetic_weights(spec, so);
  for (int tp : {2, 4}) {
    std::vector<ModelWeights> r;
    for (int k = 0; k < tp; ++k) r.push_back(tp_rank_weights(spec, w, k, tp));
    auto row_concat = [&](auto get) {  // rank slices stacked by rows
      std::vector<float> all;
      for (auto& x : r) all.insert(all.end(), get(x).data.begin(), get(x).data.end());
      return all;
    };
    auto col_concat = [&](auto get) {  // rank slices side by side
      const int rows = get(r[0]).rows;
      std::vector<float> all;
      for (int i = 0; i < rows; ++i)
        for (auto& x : r) all.insert(all.end(), get(x).row(i), get(x).row(i) + get(x).cols);
      return all;
    };
    EXPECT_EQ(row_concat([](const ModelWeights& x) -> const Mat& { return x.lm_head; }), w.lm_head.data);
    for (int l = 0; l < spec.num_layers; ++l) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " layer " + std::to_string(l));
      const LayerWeights& L = w.layers[size_t(l)];
      auto lay = [l](const ModelWeights& x) -> const LayerWeights& { return x.layers[size_t(l)]; };
      EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).wq; }), L.wq.data);
      EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).wk; }), L.wk.data);
      EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).wv; }), L.wv.data);
      EXPECT_EQ(col_concat([&](auto& x) -> const Mat& { return lay(x).wo; }), L.wo.data);
      for (auto& x : r) {
        EXPECT_EQ(lay(x).input_norm, L.input_norm);
        EXPECT_EQ(lay(x).q_norm, L.q_norm);
        EXPECT_EQ(lay(x).wik.data, L.wik.data);
      }
      if (spec.sparse(l)) {
        EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).wiq; }), L.wiq.data);
      }
      if (spec.moe(l)) {
        for (auto& x : r) EXPECT_EQ(lay(x).router.data, L.router.data);
        for (int e = 0; e < spec.num_experts; e += 5) {
          EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).experts[size_t(e)].gate; }),
                    L.experts[size_t(e)].gate.data);
          EXPECT_EQ(col_concat([&](auto& x) -> const Mat& { return lay(x).experts[size_t(e)].down; }),
                    L.experts[size_t(e)].down.data);
        }
        EXPECT_EQ(row_concat([&](auto& x) -> const Mat& { return lay(x).shared.up; }), L.shared.up.data);
      } else {
        EXPECT_EQ(col_concat([&](auto& x) -> const Mat& { return lay(x).dense.down; }), L.dense.down.data);
      }
    }
  }
}

namespace {
void check_against_tp1(const ModelSpec& spec) {
  // Bound: sharding changes only the order of the sums over the split dimensions (the O
  // projection's heads, the MLP / expert widths: N partial sums added in rank order) and nothing
  // else (the same routing, selections and softmax inputs as long as no choice is a near-tie). A
  // reordered fp32 sum of n terms differs by <= ~n eps sum|terms| (eps 6e-8) per output; through 4
  // layers of norms, attention and MoE these stay ~1e-6 of a row's max logit (measured ~1e-6 on
  // this model); 1e-4 leaves room and still catches a missing or doubled all-reduce (an O(1) error).
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  std::printf("seed %u\n", unsigned(so.seed));
  const ModelWeights w = synthetic_weights(spec, so);
  std::mt19937 rng(so.seed);
  const int prompt = 70, steps = 6, blocks = (prompt + steps) / spec.index_block + 2;
  std::vector<int32_t> toks(static_cast<size_t>(prompt));
  for (auto& t : toks) t = int32_t(rng() % uint32_t(spec.vocab_size));
  constexpr double kBound = 1e-4;
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    ref::RefOptions o{blocks, 2};
    o.tp = tp;
    auto bt = ref::make_ref_backend(spec, w, o);
    EXPECT_EQ(bt->name(), "cpu-ref tp" + std::to_string(tp));
    auto t1 = ref::make_ref_backend(spec, w, ref::RefOptions{blocks, 2});  // a fresh cache for each pair
    SelectionTrace s1, st;
    s1.record_cache = st.record_cache = true;
    StepOutput o1 = t1->step(one_seq(toks, 0, blocks, true), &s1);
    StepOutput ot = bt->step(one_seq(toks, 0, blocks, true), &st);
    ASSERT_EQ(ot.vocab, o1.vocab);
    ASSERT_EQ(ot.logits.size(), o1.logits.size());
    int row = -1;
    const double pre = worst_rel(o1, ot, &row);
    EXPECT_LE(pre, kBound) << "prefill row " << row;
    // the same choices: blocks of every KV group (merged in group order), experts, cache entries.
    // The experts of a token as a set: their best-first order swaps where two router scores are
    // within the rounding of the reordered sums (seen: {7, 11, 2, 6} at TP 1, {7, 2, 11, 6} at TP 4,
    // the same four experts, whose weighted sum the logits bound covers); a set may differ only at
    // such a near-tie on the k-th place: at most 1% of the rows (a missing all-reduce changes most).
    EXPECT_EQ(st.layers, s1.layers);
    EXPECT_EQ(st.blocks, s1.blocks);
    ASSERT_EQ(st.experts.size(), s1.experts.size());
    size_t expert_rows = 0, set_differs = 0, order_differs = 0;
    for (size_t l = 0; l < s1.experts.size(); ++l) {
      ASSERT_EQ(st.experts[l].size(), s1.experts[l].size()) << "moe layer " << l;
      for (size_t r = 0; r < s1.experts[l].size(); ++r) {
        std::vector<int32_t> a = s1.experts[l][r], b = st.experts[l][r];
        ++expert_rows;
        order_differs += a != b;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        set_differs += a != b;
      }
    }
    EXPECT_LE(set_differs, std::max<size_t>(1, expert_rows / 100))
        << set_differs << " of " << expert_rows << " token rows chose other experts";
    ASSERT_EQ(st.cache_k.size(), s1.cache_k.size());
    double cache_worst = 0;
    for (size_t l = 0; l < s1.cache_k.size(); ++l) {
      ASSERT_EQ(st.cache_k[l].size(), s1.cache_k[l].size());
      ASSERT_EQ(st.cache_v[l].size(), s1.cache_v[l].size());
      for (size_t i = 0; i < s1.cache_k[l].size(); ++i)
        cache_worst = std::max({cache_worst, double(std::fabs(st.cache_k[l][i] - s1.cache_k[l][i])),
                                double(std::fabs(st.cache_v[l][i] - s1.cache_v[l][i]))});
    }
    EXPECT_LE(cache_worst, 1e-3) << "K / V cache entries (values of order 1)";
    // greedy decode, each path on its own argmax; ids equal while TP 1's margin is above the bound
    int32_t next1 = int32_t(std::max_element(o1.logits.end() - spec.vocab_size, o1.logits.end()) -
                            (o1.logits.end() - spec.vocab_size));
    int32_t nextt = int32_t(std::max_element(ot.logits.end() - spec.vocab_size, ot.logits.end()) -
                            (ot.logits.end() - spec.vocab_size));
    double worst_step = 0;
    int compared = 0;
    for (int s = 0; s < steps; ++s) {
      ASSERT_EQ(nextt, next1) << "step " << s;
      StepOutput a = t1->step(one_seq({next1}, prompt + s, blocks, false), nullptr);
      StepOutput b = bt->step(one_seq({nextt}, prompt + s, blocks, false), nullptr);
      worst_step = std::max(worst_step, worst_rel(a, b));
      std::vector<float> sorted = a.logits;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const float mx = *std::max_element(a.logits.begin(), a.logits.end(), [](float x, float y) {
        return std::fabs(x) < std::fabs(y);
      });
      next1 = int32_t(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin());
      nextt = int32_t(std::max_element(b.logits.begin(), b.logits.end()) - b.logits.begin());
      if (sorted[0] - sorted[1] <= 2 * kBound * std::fabs(mx)) nextt = next1;  // a near-tie: follow TP 1
      ++compared;
    }
    EXPECT_LE(worst_step, kBound);
    std::printf("  tp %d vs tp 1: prefill %d rows worst max|d|/max|ref| %.3g, %d decode steps worst %.3g, "
                "cache entries worst |d| %.3g; expert rows %zu, order differs %zu, set differs %zu\n",
                tp, prompt, pre, compared, worst_step, cache_worst, expert_rows, order_differs, set_differs);
  }
}

}  // namespace

TEST(RefTp, Tp2AndTp4MatchTp1) {
  for (bool replicated : {false, true}) {
    SCOPED_TRACE(replicated ? "tiny, KV heads replicated at tp 4" : "4 KV heads, split");
    check_against_tp1(replicated ? synthetic_preset("tiny") : tp4_spec());
  }
}

TEST(RefTp, FixturesPassConformanceAtTp2And4) {
  // every fixture at every split it allows (tiny-m3-a: 2 KV heads split at TP 2, replicated at
  // TP 4; tiny-m3-b's 3 KV heads allow neither: checked as a refusal)
  int seen = 0;
  for (const auto& e : fs::directory_iterator(M3_TEST_DATA)) {
    const fs::path dir = e.path();
    if (!e.is_directory() || !fs::exists(dir / "golden.safetensors")) continue;
    SCOPED_TRACE(dir.string());
    const ModelSpec spec = load_model_spec(dir);
    const ModelWeights w = load_model_weights(dir, spec);
    auto golden = ref::load_golden(dir / "golden.safetensors");
    int most = 0;
    for (const auto& g : golden) most = std::max(most, g.tokens() + g.steps());
    for (int tp : {2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      const int kv = spec.num_kv_heads;
      if (kv % tp != 0 && tp % kv != 0) {
        EXPECT_THROW(tp_rank_spec(spec, tp), Error);
        std::printf("%s at tp %d: refused (%d KV heads)\n", dir.filename().c_str(), tp, kv);
        continue;
      }
      ref::RefOptions o{most / spec.index_block + 2, 2};
      o.tp = tp;
      auto b = ref::make_ref_backend(spec, w, o);
      const auto rep = ref::run_conformance(*b, golden);
      double worst = 0;
      for (const auto& c : rep.checks) {
        EXPECT_TRUE(c.ok) << c.name << ": " << c.detail;
        if (c.name.find("logits") != std::string::npos) worst = std::max(worst, c.worst);
      }
      std::printf("%s at tp %d: %zu checks, worst logits max|d|/max|golden| %.3g (bound 1e-3)\n",
                  dir.filename().c_str(), tp, rep.checks.size(), worst);
      ++seen;
    }
  }
  EXPECT_GE(seen, 2);
}

TEST(RefTp, SplitsThatDoNotDivideNameTheDimension) {
  ModelSpec spec = synthetic_preset("tiny");  // 8 heads, 2 KV heads
  SyntheticOptions so;
  const ModelWeights w = synthetic_weights(spec, so);
  ModelSpec six = spec;  // tiny-m3-b's heads: 6 query, 3 KV
  six.num_heads = 6;
  six.num_kv_heads = six.index_heads = 3;
  struct Case {
    const ModelSpec* s;
    int tp;
    const char* field;
  };
  for (Case c : {Case{&spec, 3, "num_attention_heads = 8"}, Case{&six, 2, "num_key_value_heads = 3"},
                 Case{&spec, 16, "num_attention_heads = 8"}}) {
    try {
      tp_rank_spec(*c.s, c.tp);
      ADD_FAILURE() << "tp " << c.tp << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--tp " + std::to_string(c.tp)), std::string::npos) << e.what();
    }
  }
  {
    ref::RefOptions o{8, 1};
    o.tp = 3;
    EXPECT_THROW(ref::make_ref_backend(spec, w, o), Error);
  }
  // 4 ranks over 2 KV heads: replicated, each rank the one its two query heads use
  const ModelSpec r4 = tp_rank_spec(spec, 4);
  EXPECT_EQ(r4.num_heads, 2);
  EXPECT_EQ(r4.num_kv_heads, 1);
  EXPECT_EQ(r4.index_heads, 1);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(tp_rank_kv_head(spec, r, 4), r / 2);
  ref::RefOptions o{8, 1};
  o.tp = 0;
  EXPECT_THROW(ref::make_ref_backend(spec, w, o), Error);
}

TEST(RefTp, RanksReadOnlyTheirSlicesFromACheckpoint) {
  // make_ref_backend from a checkpoint's binding (each rank reads its row / column ranges of the
  // files) gives bitwise the logits of the ranks sliced from the whole weights in memory
  const ModelSpec spec = tp4_spec();
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  const fs::path dir = fs::temp_directory_path() / ("m3_tp_src_" + std::to_string(so.seed));
  write_synthetic_checkpoint(dir, spec, so);
  const ModelWeights w = synthetic_weights(spec, so);
  SafetensorsSet files = SafetensorsSet::open(dir);
  const WeightBinding b = bind_weights(build_checkpoint_table(spec, files, dir), files);
  std::vector<int32_t> toks{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8};
  for (int tp : {2, 4}) {
    ref::RefOptions o{4, 2};
    o.tp = tp;
    auto from_files = ref::make_ref_backend(spec, *make_weight_source(b), o);
    auto from_memory = ref::make_ref_backend(spec, w, o);
    const StepOutput a = from_files->step(one_seq(toks, 0, 4, true), nullptr);
    const StepOutput m = from_memory->step(one_seq(toks, 0, 4, true), nullptr);
    ASSERT_EQ(a.logits.size(), m.logits.size());
    EXPECT_EQ(std::memcmp(a.logits.data(), m.logits.data(), a.logits.size() * 4), 0) << "tp " << tp;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(RefTp, RanksFromTheirOwnWeightsEqualSlicedRanks) {
  // make_ref_backend_from_ranks (each rank's own weights: the GPU tests hand it every rank's
  // dequantized arena) given the slices of one model gives bitwise make_ref_backend's logits; a
  // rank given weights of the wrong shape is refused naming the tensor
  const ModelSpec spec = tp4_spec();
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  const ModelWeights w = synthetic_weights(spec, so);
  std::vector<int32_t> toks{2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5};
  for (int tp : {1, 2, 4}) {
    ref::RefOptions o{4, 2};
    o.tp = tp;
    auto sliced = ref::make_ref_backend(spec, w, o);
    auto own = ref::make_ref_backend_from_ranks(spec, [&](int r) { return tp_rank_weights(spec, w, r, tp); }, o);
    const StepOutput a = sliced->step(one_seq(toks, 0, 4, true), nullptr);
    const StepOutput b = own->step(one_seq(toks, 0, 4, true), nullptr);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0) << "tp " << tp;
  }
  ref::RefOptions o{4, 2};
  o.tp = 2;
  EXPECT_THROW(ref::make_ref_backend_from_ranks(spec, [&](int) { return w; }, o), Error);  // full shapes on a rank
}
