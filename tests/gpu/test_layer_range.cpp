// The mono seam (native/layer_range.h): a LayerRangeRunner registered on CudaBackend is offered
// every step and, when it accepts, runs the sparse layer range in place of the plan's ops. Here the
// runner launches the plan's own ops for its range (what native does) and accepts what mono will
// (decode batches of at most 4 rows), so every logits row must be bitwise the plain backend's,
// with graphs captured and replayed per (bucket, path), and the steps per path and fallback
// reasons counted as the rules say.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "native/forward.h"
#include "native/layer_range.h"
#include "runtime/dispatcher.h"
#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

class PlanOpsRunner final : public native::LayerRangeRunner {
 public:
  int asked = 0, runs = 0;
  native::LayerRange last_range;
  std::string name() const override { return "plan-ops"; }
  std::string refusal(const StepBatch& b) override {
    ++asked;
    return mono_batch_refusal(b, 4);
  }
  void run_layers(const native::LayerPlan& plan, native::LayerRange r, cudaStream_t s) override {
    ++runs;
    last_range = r;
    for (int i = plan.layer_first_op(r.first); i < plan.layer_first_op(r.last); ++i) native::launch(plan.ops[size_t(i)], s);
  }
};

}  // namespace

TEST(GpuLayerRange, RunnerIsChosenPerStepAndGivesTheSameBits) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  const PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int V = spec.vocab_size, bs = spec.index_block;
  native::CudaBackendOptions o;
  o.num_cache_blocks = 64;
  o.max_graph_batch = 8;
  auto plain = native::make_cuda_backend(m.pw, o);
  auto with = native::make_cuda_backend(m.pw, o);
  auto runner = std::make_unique<PlanOpsRunner>();
  PlanOpsRunner* r = runner.get();
  with->add_layer_range_runner(std::move(runner));
  for (auto* b : {plain.get(), with.get()}) b->kv_cache().fill(0x7f, nullptr);  // NaN poison
  M3_CUDA_CHECK(cudaDeviceSynchronize());

  const int nseq = 6, per = 8;
  std::vector<std::vector<int32_t>> toks(nseq), tables(nseq);
  for (int s = 0; s < nseq; ++s) {
    for (int b = 0; b < per; ++b) tables[size_t(s)].push_back(int32_t(s * per + b));
    const int len = 1 + int(rng() % unsigned(3 * bs));
    for (int t = 0; t < len; ++t) toks[size_t(s)].push_back(int32_t(rng() % unsigned(V)));
  }
  // (first, count, decode): prefill of 3, decodes of 3, prefill of 3 more, decodes of 6, 4, 1, 4, 2
  struct Step {
    int first, count;
    bool decode;
    const char* path;
    const char* fallback;
  };
  const Step plan[] = {{0, 3, false, "native", "plan-ops:prefill"},
                       {0, 3, true, "plan-ops", ""},
                       {3, 3, false, "native", "plan-ops:prefill"},
                       {0, 6, true, "native", "plan-ops:batch_too_large"},
                       {0, 4, true, "plan-ops", ""},
                       {2, 1, true, "plan-ops", ""},
                       {0, 4, true, "plan-ops", ""},
                       {1, 2, true, "plan-ops", ""},
                       {0, 6, true, "native", "plan-ops:batch_too_large"},
                       {0, 3, true, "plan-ops", ""}};
  std::vector<int> done(nseq, 0);  // tokens of each sequence already in the caches
  size_t compared = 0;
  for (const Step& st : plan) {
    StepBatch b;
    for (int s = st.first; s < st.first + st.count; ++s) {
      SeqStep q;
      q.start_pos = done[size_t(s)];
      if (st.decode) q.tokens = {toks[size_t(s)].back()};
      else q.tokens = toks[size_t(s)];
      q.block_table = tables[size_t(s)];
      b.seqs.push_back(q);
    }
    const StepOutput a = plain->step(b);
    const StepOutput w = with->step(b);
    EXPECT_EQ(a.path, "native");
    EXPECT_EQ(w.path, st.path);
    EXPECT_EQ(w.fallback_reason, st.fallback);
    ASSERT_EQ(a.logits.size(), w.logits.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < a.logits.size(); ++i)
      if (std::memcmp(&a.logits[i], &w.logits[i], 4) != 0) first = differ++ ? first : i;
    EXPECT_EQ(differ, 0u) << "path " << st.path << ": " << differ << " of " << a.logits.size()
                          << " logits differ, first at " << first;
    compared += a.logits.size();
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const int s = st.first + int(i);
      done[size_t(s)] += int(b.seqs[i].tokens.size());
      const float* row = a.row(int(i));
      toks[size_t(s)].push_back(int32_t(std::max_element(row, row + V) - row));
    }
  }
  const Dispatcher& d = with->dispatcher();
  EXPECT_EQ(d.steps_by_path().at("plan-ops"), 6u);
  EXPECT_EQ(d.steps_by_path().at("native"), 4u);
  EXPECT_EQ(d.fallbacks().at("plan-ops:prefill"), 2u);
  EXPECT_EQ(d.fallbacks().at("plan-ops:batch_too_large"), 2u);
  EXPECT_EQ(r->asked, 10);
  // graphs: buckets 4 (three steps), 1 and 2 on the runner's path: eager + capture once per bucket,
  // replays do not call the runner
  EXPECT_EQ(r->runs, 2 * 3);
  EXPECT_GE(with->stats().graph_replays, 3);
  EXPECT_EQ(r->last_range.last, spec.num_layers);
  EXPECT_GT(r->last_range.last, r->last_range.first);
  std::printf("  [layer range] %zu logits compared bitwise, runner ran %d times over layers [%d, %d)\n", compared,
              r->runs, r->last_range.first, r->last_range.last);
}
