// EAGLE3 on the CUDA backend (native/aux_capture.h, issue 18): the target's auxiliary hidden states
// copied out of the native plan, in eager passes and in captured decode graphs:
//   - layer 0's rows are the embedding rows (the prepared BF16 table, exactly);
//   - every layer's rows within a stated bound of the CPU reference on the same dequantized weights
//     with the GPU's FP8 cache codec (short prompts: every block selected, no near-ties);
//   - a decode step's rows the same bits alone and beside other sequences, replayed and eager, and
//     on mono, which runs its layers in parts cut where a copy is made (a layer whose input norm is
//     an op of its own inside mono's layers: declined, "aux", and run natively);
//   - greedy generation with EAGLE3 drafts (a synthetic draft for tiny-m3-a) equal to plain decoding,
//     natively and with mono, with the draft's default aux layers (1, 2, 3: mono declines) and with
//     layers mono serves in parts (2, 3, 4).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "model/synthetic_eagle3.h"
#include "mono/mono.h"
#include "ref/cache_codec.h"
#include "ref/eagle3.h"
#include "runtime/generate.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<native::CudaBackend> cuda_with_mono(const PreparedModel& m, const native::CudaBackendOptions& o) {
  auto be = native::make_cuda_backend(m.pw, o);
  auto r = mono::create(be->model(), mono::MonoOptions{});
  if (auto* refusal = std::get_if<mono::Refusal>(&r)) ADD_FAILURE() << refusal->text();
  else be->add_layer_range_runner(std::move(std::get<std::unique_ptr<mono::MonoRunner>>(r)));
  return be;
}

std::vector<int32_t> table(int first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

}  // namespace

TEST(GpuEagle3, AuxRowsMatchTheReferenceAndAreBatchInvariant) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const PreparedModel m = prepare_from_dir(test_data_dir() / "tiny-m3-a");
  const ModelSpec& s = m.spec;
  const int H = s.hidden, L = s.num_layers;
  std::vector<int> layers;
  for (int l = 0; l <= L; ++l) layers.push_back(l);
  const int W = int(layers.size()) * H;
  native::CudaBackendOptions o;
  o.num_cache_blocks = 32;
  auto nat = native::make_cuda_backend(m.pw, o);
  ref::RefOptions ro{32, 0};
  ro.cache.kv_dtype = DType::F8_E4M3;
  ro.cache.ik_dtype = DType::F8_E4M3;
  ro.cache.k_scale = o.k_scale;
  ro.cache.v_scale = o.v_scale;
  ro.cache.ik_scale = o.ik_scale;
  auto ref = ref::make_ref_backend(s, m.deq, ro);
  // a short prompt (every block selected), then decode steps
  std::vector<int32_t> prompt(static_cast<size_t>(6 + rng() % 20));
  for (auto& x : prompt) x = int32_t(rng() % unsigned(s.vocab_size));
  int n = int(prompt.size());
  StepBatch b;
  b.seqs.push_back(SeqStep{0, prompt, table(0, 4), false});
  b.seqs[0].want_aux = true;
  b.aux_layers = layers;
  const StepOutput g = nat->step(b), r = ref->step(b);
  ASSERT_EQ(g.aux_width, W);
  ASSERT_EQ(g.aux.size(), size_t(n) * W);
  double worst = 0;
  int worst_at = -1;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < H; ++j)
      ASSERT_EQ(g.aux_row(0, i)[j], m.deq.embed.row(prompt[size_t(i)])[j]) << "token " << i << ": layer 0 row";
    for (int k = 1; k <= L; ++k) {
      // the residual stream after k layers, fp32 sums in another order and FP8 caches on both
      // sides: ~1e-5 relative (the whole-model logits agree to ~7e-6); 1e-3 catches a wrong layer
      const double d = rel_maxdiff(g.aux_row(0, i) + k * H, r.aux_row(0, i) + k * H, H);
      if (d > worst) worst = d, worst_at = i * 1000 + k;
    }
  }
  EXPECT_LT(worst, 1e-3) << "token " << worst_at / 1000 << " layer " << worst_at % 1000;
  // decode steps: alone (graph captured, then replayed), beside two other sequences, on mono
  auto mon = cuda_with_mono(m, o);
  auto other = [&](native::CudaBackend& be) {  // two more sequences in blocks 8.., 12..
    for (int z = 0; z < 2; ++z) {
      StepBatch p;
      p.seqs.push_back(SeqStep{0, {int32_t(z + 3), 9, 27}, table(8 + 4 * z, 4), false});
      be.step(p);
    }
  };
  StepBatch pre = b;
  pre.aux_layers.clear();
  pre.seqs[0].want_aux = false;
  mon->step(pre);
  other(*mon);
  int32_t tok = int32_t(rng() % unsigned(s.vocab_size));
  size_t compared = 0;
  for (int step = 0; step < 6; ++step) {
    StepBatch alone;
    alone.seqs.push_back(SeqStep{n, {tok}, table(0, 4), false});
    alone.seqs[0].want_aux = true;
    alone.aux_layers = layers;
    const StepOutput a = nat->step(alone);
    const StepOutput rr = ref->step(alone);
    StepBatch three;
    three.seqs.push_back(SeqStep{3 + step, {5}, table(8, 4), false});
    three.seqs.push_back(SeqStep{n, {tok}, table(0, 4), false});
    three.seqs.push_back(SeqStep{3 + step, {6}, table(12, 4), false});
    three.seqs[1].want_aux = true;
    // odd steps: every layer (layer 1's input norm is an op inside mono's layers 1-3: declined);
    // even steps: layers 0, 2, 3, 4 (mono cut after layers 1 and 2)
    three.aux_layers = step % 2 ? layers : std::vector<int>{0, 2, 3, L};
    const StepOutput c = mon->step(three);
    if (step % 2) {
      EXPECT_EQ(c.path, "native") << "mono took a step with a layer it cannot copy out";
      EXPECT_EQ(c.fallback_reason, "mono:aux");
    } else {
      EXPECT_EQ(c.path, "mono") << "mono declined (" << c.fallback_reason << ") layers it can be cut for";
    }
    ASSERT_EQ(c.aux_first_row, (std::vector<int>{-1, 0, -1}));
    for (size_t k = 0; k < three.aux_layers.size(); ++k)
      for (int j = 0; j < H; ++j)
        ASSERT_EQ(c.aux_row(1)[k * H + j], a.aux_row(0)[three.aux_layers[k] * H + j])
            << "decode step " << step << " layer " << three.aux_layers[k] << " element " << j;
    for (int k = 1; k <= L; ++k) {
      const double d = rel_maxdiff(a.aux_row(0) + k * H, rr.aux_row(0) + k * H, H);
      EXPECT_LT(d, 1e-3) << "decode step " << step << " layer " << k;
    }
    compared += size_t(W);
    tok = int32_t(argmax_of(a.row(0), s.vocab_size));
    ++n;
  }
  // a step without aux rows on mono still runs there
  StepBatch plain;
  plain.seqs.push_back(SeqStep{n, {tok}, table(0, 4), false});
  EXPECT_EQ(mon->step(plain).path, "mono");
  std::printf("  [eagle3 aux] prefill %zu tokens x %d layers within %.3g of the reference; %zu decode values bitwise "
              "alone / batched / replayed\n", prompt.size(), L + 1, worst, compared);
}

TEST(GpuEagle3, GreedyOutputsEqualPlainDecoding) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const fs::path target = test_data_dir() / "tiny-m3-a";
  const PreparedModel m = prepare_from_dir(target);
  const fs::path draft = fs::path(testing::TempDir()) / ("m3_gpu_eagle3_" + std::to_string(seed));
  SyntheticEagle3Options eo;
  eo.seed = seed % 1000 + 1;
  const Eagle3Spec ds = write_synthetic_eagle3(draft, m.spec, eo);
  auto drafter_default = ref::load_eagle3_drafter(draft, target, m.spec, 0);
  Eagle3Spec cut = ds;  // the same weights reading the hidden states entering layers 2, 3 and 4
  cut.aux_layers = {2, 3, m.spec.num_layers};
  std::ofstream(draft / "config.json") << eagle3_spec_to_json(cut);
  auto drafter_cut = ref::load_eagle3_drafter(draft, target, m.spec, 0);
  native::CudaBackendOptions o;
  o.num_cache_blocks = 64;
  auto nat = native::make_cuda_backend(m.pw, o);
  auto mon = cuda_with_mono(m, o);
  int verify = 0;
  std::map<std::string, int> paths;
  for (int trial = 0; trial < 6; ++trial) {
    auto drafter = trial % 2 ? drafter_cut : drafter_default;
    GenerateRequest r;
    for (int k = 0, len = 5 + int(rng() % 150); k < len; ++k) r.prompt.push_back(int32_t(rng() % unsigned(m.spec.vocab_size)));
    r.max_tokens = 24;
    const GenerateResult plain = generate(*nat, r);
    GenerateRequest e = r;
    e.speculative.method = SpeculativeMethod::Eagle3;
    e.speculative.drafter = drafter;
    e.speculative.num_draft_tokens = 1 + trial % 3;
    const GenerateResult a = generate(*nat, e), b = generate(*mon, e);
    EXPECT_EQ(a.ids, plain.ids) << "native, trial " << trial;
    EXPECT_EQ(b.ids, plain.ids) << "mono, trial " << trial;
    verify += a.verify_steps + b.verify_steps;
    for (const auto& [p, c] : b.paths) paths[p + (trial % 2 ? " (layers 2,3,4)" : " (layers 1,2,3)")] += c;
  }
  EXPECT_GT(verify, 0);
  EXPECT_GT(paths["mono (layers 2,3,4)"], 0) << "mono never ran an EAGLE3 step it can be cut for";
  std::string by;
  for (const auto& [p, c] : paths) by += fmt::format(" {} {}", p, c);
  std::printf("  [eagle3 tiny-m3-a] %d verify steps, outputs equal to plain decoding; mono backend's steps:%s\n", verify,
              by.c_str());
  fs::remove_all(draft);
}
