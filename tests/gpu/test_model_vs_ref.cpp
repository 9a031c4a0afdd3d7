// Whole-model checks of the CUDA native backend (the GPU acceptance; scripts/gpu-check.sh
// collects the "MODEL" lines these tests print into its table):
// 1. against the CPU reference run on the SAME prepared weights dequantized to fp32, on a
//    synthetic model with the released head layout (real-heads: 64 q / 4 KV heads of 128, index
//    4 x 128, block 128, hidden 1024, 4 sparse layers) and on tiny-m3-a, prompts longer than 16
//    blocks so the selection is really sparse, then 64 greedy decode steps (CUDA-graph buckets),
//    in four variants: FP8 or BF16 caches x bf16 GEMM activations in the prefill (default) or fp32
//    activations everywhere. Figures per variant: logits cosine (min, median, rows under 0.999),
//    argmax differences with the reference's top-1 margin, selections equal as sets / near-ties /
//    other flips.
//    These random-weight MoE models are chaotic: the reference itself, with its norm weights
//    perturbed by +-2^-9 (the size of one bf16 rounding), falls to cosine 0.95-0.99 at a few steps
//    and flips greedy ids (router top-k and block top-k near-ties amplify any rounding). A literal
//    "cosine >= 0.999 at every step" therefore holds for no engine that rounds differently from the
//    reference. The gate is stated against that yardstick, measured in the same test: the exact
//    variant (BF16 caches, fp32 activations) must deviate from the reference no more than the
//    perturbed reference does (1 - median cosine, rows under 0.999, argmax and selection
//    differences: within 2x + a small allowance); the other variants (FP8 caches and/or bf16 GEMM
//    activations) are reported next to it with sanity bounds on their median and worst row.
// 2. against the transformers golden of tiny-m3-a (float64 from the bf16 checkpoint): the GPU's
//    distance to the golden next to the CPU reference's distance on the same prepared weights (the
//    part FP8/MXFP4 weight quantization alone explains), with the bounds stated below.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>

#include "native/kv_cache.h"
#include "ref/golden.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Tie bound for selection flips: index scores are dot products of iq with an FP8 index-K cache
// entry (relative rounding <= 2^-4 per element) and of FP8-projected activations; two blocks whose
// max-pooled scores are within 3% of the row's largest |score| can swap order under that rounding.
constexpr double kTieRel = 0.03;

// Cache formats and activation precision of a GPU run. The exact variant (BF16 caches, fp32
// activations everywhere) leaves accumulation order and 2^-9 cache rounding; the default one adds
// FP8 caches and, for passes of more than 16 rows (the prefill), bf16-rounded activations in the
// cuBLASLt GEMM.
struct Variant {
  const char* name;
  DType kv, ik;
  bool fp32_act;
  bool exact;
};

int rows_below(const LogitsStats& st, double c) {
  return int(std::count_if(st.cos.begin(), st.cos.end(), [&](double x) { return x < c; }));
}

// One reference run: traced prefill, then decode fed with `ids` (empty: its own greedy ids).
struct RefRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> ids;
  SelectionTrace trace;
  double seconds = 0;
};

RefRun run_reference(const ModelSpec& spec, const ModelWeights& w, int blocks, const std::vector<int32_t>& prompt,
                     const std::vector<int32_t>& table, int steps, const std::vector<int32_t>* feed) {
  RefRun r;
  auto ref = ref::make_ref_backend(spec, w, ref::RefOptions{blocks, 0});
  const int V = spec.vocab_size, P = int(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  StepOutput o = ref->step(StepBatch{{SeqStep{0, prompt, table, false}}}, &r.trace);
  r.logits.push_back(o.logits);
  r.ids.push_back(int32_t(argmax_of(o.logits.data(), V)));
  for (int s = 1; s < steps; ++s) {
    const int32_t t = feed ? (*feed)[size_t(s - 1)] : r.ids.back();
    o = ref->step(StepBatch{{SeqStep{P + s - 1, {t}, table, false}}});
    r.logits.push_back(o.logits);
    r.ids.push_back(int32_t(argmax_of(o.logits.data(), V)));
  }
  r.seconds = seconds_since(t0);
  return r;
}

// default_min_cos / default_median_cos: sanity bounds on the worst row and the median of the
// non-exact variants (FP8 caches round at 2^-4, 32x the yardstick's perturbation).
void model_vs_reference(const char* model_name, const PreparedModel& m, int prompt_len, int steps, uint64_t seed,
                        double default_min_cos, double default_median_cos) {
  std::mt19937_64 rng(seed);
  const ModelSpec& spec = m.spec;
  const int V = spec.vocab_size, bs = spec.index_block;
  const int total = prompt_len + steps;
  ASSERT_GT(prompt_len, 16 * bs) << "the prompt must exceed 16 blocks so the selection is sparse";
  const int blocks = (total + bs - 1) / bs + 4;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (auto& t : prompt) t = tok(rng);

  // The reference (its greedy ids drive every other run), and the yardstick: the reference with
  // each layer's (1 + input_norm) scaled by 1 +- 2^-9, fed the same tokens.
  RefRun ref = run_reference(spec, m.deq, blocks, prompt, table, steps, nullptr);
  LogitsStats yard;
  SelectionStats yard_sel;
  {
    ModelWeights p = m.deq;
    std::mt19937_64 prng(seed ^ 0x5bd1e995u);
    for (auto& L : p.layers)
      for (auto& x : L.input_norm) x = (1 + x) * (1 + ((prng() & 1) ? 1 : -1) * 0x1p-9f) - 1;
    RefRun y = run_reference(spec, p, blocks, prompt, table, steps, &ref.ids);
    for (int s = 0; s < steps; ++s) yard.add(y.logits[size_t(s)].data(), ref.logits[size_t(s)].data(), V, "step " + std::to_string(s));
    yard_sel = compare_selections(y.trace, ref.trace, nullptr, 0);
  }
  std::printf("MODEL | %s yardstick: CPU ref with norms perturbed by 2^-9 | prompt %d + %d steps | cos min %.6f median "
              "%.7f, rows < 0.999: %d | argmax diffs %d | selections %lld rows, %lld differ | ref %.1f s\n",
              model_name, prompt_len, steps, yard.min_cos, yard.median_cos(), rows_below(yard, 0.999), yard.argmax_diff,
              (long long)yard_sel.rows, (long long)yard_sel.differ, ref.seconds);
  std::fflush(stdout);

  for (const Variant& var : {Variant{"fp8-kv (default)", DType::F8_E4M3, DType::F8_E4M3, false, false},
                             Variant{"bf16-kv", DType::BF16, DType::BF16, false, false},
                             Variant{"fp8-kv fp32-act", DType::F8_E4M3, DType::F8_E4M3, true, false},
                             Variant{"bf16-kv fp32-act (exact)", DType::BF16, DType::BF16, true, true}}) {
    SCOPED_TRACE(var.name);
    native::CudaBackendOptions o;
    o.num_cache_blocks = blocks;
    o.kv_dtype = var.kv;
    o.ik_dtype = var.ik;
    o.fp32_activations = var.fp32_act;
    auto gpu = native::make_cuda_backend(m.pw, o);
    gpu->kv_cache().fill(0x7f, nullptr);  // NaN poison: a read of an unwritten slot shows in the logits
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    SelectionTrace gtrace;
    native::BlockScoreTrace scores;
    gpu->set_block_score_trace(&scores);
    auto g0 = std::chrono::steady_clock::now();
    StepOutput gp = gpu->step(StepBatch{{SeqStep{0, prompt, table, false}}}, &gtrace);
    const double prefill_s = seconds_since(g0);
    gpu->set_block_score_trace(nullptr);
    LogitsStats st;
    double worst_margin = 0;  // largest reference margin (relative to max|ref|) at an argmax difference
    auto add = [&](const std::vector<float>& g, int s) {
      const int before = st.argmax_diff;
      st.add(g.data(), ref.logits[size_t(s)].data(), V, "step " + std::to_string(s));
      if (st.argmax_diff != before) {
        double mx = 0;
        for (float v : ref.logits[size_t(s)]) mx = std::max(mx, double(std::fabs(v)));
        worst_margin = std::max(worst_margin, top1_margin(ref.logits[size_t(s)].data(), V) / mx);
      }
    };
    add(gp.logits, 0);
    // step 1 runs the bucket eagerly and captures it; the rest replay (timed)
    auto d0 = std::chrono::steady_clock::now();
    for (int s = 1; s < steps; ++s) {
      StepOutput g = gpu->step(StepBatch{{SeqStep{prompt_len + s - 1, {ref.ids[size_t(s - 1)]}, table, false}}});
      add(g.logits, s);
      if (s == 1) d0 = std::chrono::steady_clock::now();
    }
    const double decode_ms = seconds_since(d0) * 1e3 / std::max(1, steps - 2);
    SelectionStats sel = compare_selections(gtrace, ref.trace, &scores, kTieRel);
    std::printf("MODEL | %s %s vs CPU ref (prepared weights) | cos min %.6f median %.7f, rows < 0.999: %d | "
                "max|d|/max|ref| %.3g | argmax diffs %d%s%s | selections %lld rows, %lld differ (%lld near-ties <= "
                "%.2g, %lld other), worst gap %.3g | gpu prefill %.3f s, decode %.2f ms/step (graph replays %lld)\n",
                model_name, var.name, st.min_cos, st.median_cos(), rows_below(st, 0.999), st.max_rel, st.argmax_diff,
                st.argmax_diff ? " first: " : "", st.first_diff.c_str(), (long long)sel.rows, (long long)sel.differ,
                (long long)sel.near_ties, kTieRel, (long long)sel.real, sel.worst_gap, prefill_s, decode_ms,
                (long long)gpu->stats().graph_replays);
    std::fflush(stdout);
    EXPECT_EQ(st.rows, steps);
    EXPECT_GT(sel.rows, 0);
    EXPECT_GT(gpu->stats().graph_replays, 0);
    if (var.exact) {
      EXPECT_LE(1 - st.median_cos(), 2 * (1 - yard.median_cos()) + 1e-6);
      EXPECT_LE(rows_below(st, 0.999), 2 * rows_below(yard, 0.999) + std::max(1, steps / 32)) << st.first_diff;
      EXPECT_LE(st.argmax_diff, 2 * yard.argmax_diff + 1) << st.first_diff;
      EXPECT_LE(double(sel.differ), 2.0 * double(yard_sel.differ) + 0.002 * double(sel.rows)) << sel.first_real;
    } else {
      EXPECT_GE(st.median_cos(), default_median_cos);
      EXPECT_GE(st.min_cos, default_min_cos) << st.first_diff;
    }
  }
}

}  // namespace

TEST(GpuModel, RealHeadsVsReference) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ModelSpec spec = synthetic_preset("real-heads");
  PreparedModel m;
  {
    SyntheticOptions so;
    so.seed = seed;  // the same values `m3mono make-tiny --preset real-heads --seed N` writes
    ModelWeights w = synthetic_weights(spec, so);
    m = prepare_from_memory(spec, w);
  }
  EXPECT_EQ(spec.num_heads, 64);
  EXPECT_EQ(spec.num_kv_heads, 4);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_GE(spec.hidden, 1024);
  EXPECT_GE(spec.num_sparse_layers(), 4);
  // non-exact sanity bounds; measured (H200, 2026-11-30, seed 12345): worst rows 0.995-0.997,
  // medians 0.9989 (FP8 caches) to 0.99999 (BF16 caches)
  model_vs_reference("real-heads", m, 16 * 128 + 152, 64, seed, 0.98, 0.995);
}

TEST(GpuModel, TinyM3aVsReference) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  PreparedModel m = prepare_from_dir(test_data_dir() / "tiny-m3-a");
  // non-exact sanity bounds; measured (H200, 2026-11-30, seed 12345): worst rows 0.89-0.95,
  // medians 0.986 (FP8 caches) to 0.9989 (BF16 caches); its yardstick itself: 0.945 / 0.9994
  model_vs_reference("tiny-m3-a", m, 16 * 16 + 44, 64, seed, 0.8, 0.95);
}

// Against the transformers golden. The golden is float64 on the bf16 checkpoint; both the CPU
// reference on the dequantized prepared weights and the GPU carry the FP8 (attention) and MXFP4
// (experts) weight quantization, the GPU also FP8 caches. Measured with the CPU reference on this
// model (m3mono conformance --weights prepared): FP8 attention weights alone (2.6% rms weight
// error) move logits by up to 0.27 / 0.53 / 0.54 of max|golden| on the three prompts and flip 8 /
// 16 / 12 of 32 greedy ids; MXFP4 experts alone (11.6% rms) 0.25 / 0.37 / 0.40; both 0.28 / 0.60 /
// 0.54. A random tiny MoE is chaotic under small perturbations (top-4 of 16 routing flips), so no
// fixed small bound holds for any quantized engine. The bounds are therefore relative to what the
// weight quantization alone does (the CPU reference on the same weights, run here too), with room
// for the GPU's own FP8 caches and bf16 GEMM activations (which on this model move logits by up
// to ~0.5 of their range by themselves: GpuModel.TinyM3aVsReference):
// - greedy ids along the golden path (teacher-forced): gpu differences <= the CPU's + 3 (of 32);
// - prefill selections: gpu rows differing from the golden <= 1.25 x the CPU's + 2% of the rows;
// - logits: gpu max|d|/max|golden| <= 1 (no blow-up; the CPU reference on these weights already
//   reaches 0.6).
// The tight check of the GPU is against the CPU on the same weights (tests above).
TEST(GpuModel, TinyM3aAgainstTransformersGolden) {
  const auto dir = test_data_dir() / "tiny-m3-a";
  PreparedModel m = prepare_from_dir(dir);
  auto golden = ref::load_golden(dir / "golden.safetensors");
  const int V = m.spec.vocab_size, bs = m.spec.index_block;
  int most = 0;
  for (const auto& g : golden) most = std::max(most, g.tokens() + g.steps());
  const int blocks = most / bs + 2;
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  auto gpu = native::make_cuda_backend(m.pw, o);
  auto cpu = ref_backend(m, blocks);
  for (const auto& g : golden) {
    SCOPED_TRACE("prompt " + std::to_string(g.index));
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    // golden selections in the trace layout
    SelectionTrace gt;
    for (const auto& [layer, gb] : g.prefill_blocks) {
      gt.layers.push_back(layer);
      auto& L = gt.blocks.emplace_back(size_t(gb.tokens), std::vector<std::vector<int32_t>>(size_t(gb.heads)));
      for (int h = 0; h < gb.heads; ++h)
        for (int t = 0; t < gb.tokens; ++t)
          for (int j = 0; j < gb.k; ++j)
            if (gb.row(h, t)[j] >= 0) L[size_t(t)][size_t(h)].push_back(gb.row(h, t)[j]);
    }
    double rel[2] = {0, 0};
    int flips[2] = {0, 0};
    SelectionStats sel[2];
    for (int k = 0; k < 2; ++k) {
      Backend& b = k == 0 ? static_cast<Backend&>(*gpu) : *cpu;
      SelectionTrace tr;
      StepOutput pre = b.step(StepBatch{{SeqStep{0, g.ids, table, true}}}, &tr);
      for (int t = 0; t < g.tokens(); ++t)
        rel[k] = std::max(rel[k], rel_maxdiff(pre.row(0, t), g.prefill_logits.data() + size_t(t) * V, V));
      sel[k] = compare_selections(tr, gt, nullptr, 0);
      std::vector<float> row(pre.row(0, g.tokens() - 1), pre.row(0, g.tokens() - 1) + V);
      for (int s = 0; s < g.steps(); ++s) {
        if (s > 0) {
          StepOutput o2 = b.step(StepBatch{{SeqStep{g.tokens() + s - 1, {g.greedy_ids[size_t(s - 1)]}, table, false}}});
          row.assign(o2.logits.begin(), o2.logits.end());
        }
        rel[k] = std::max(rel[k], rel_maxdiff(row.data(), g.step_logits.data() + size_t(s) * V, V));
        flips[k] += argmax_of(row.data(), V) != g.greedy_ids[size_t(s)];
      }
    }
    std::printf("MODEL | tiny-m3-a vs transformers golden p%d | %d tokens + %d steps | max|d|/max|golden| gpu %.3g, cpu on "
                "the same prepared weights %.3g | greedy ids differing gpu %d, cpu %d (of %d) | selections differing "
                "gpu %lld, cpu %lld (of %lld rows)\n",
                g.index, g.tokens(), g.steps(), rel[0], rel[1], flips[0], flips[1], g.steps(), (long long)sel[0].differ,
                (long long)sel[1].differ, (long long)sel[0].rows);
    std::fflush(stdout);
    EXPECT_LE(rel[0], 1.0);
    EXPECT_LE(flips[0], flips[1] + 3);
    EXPECT_LE(double(sel[0].differ), 1.25 * double(sel[1].differ) + 0.02 * double(sel[0].rows));
  }
}
