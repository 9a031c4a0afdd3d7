// RefBackendImpl: owns the spec, fp32 weights, the paged caches (and their codecs) and a thread
// pool; step() / step_following() plan (validate) the batch, mark the slots they write, then run
// forward_step.
#include "ref/engine.h"

#include "core/check.h"
#include "ref/check_model.h"
#include "ref/forward.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"
#include "runtime/step_sampling.h"

namespace m3::ref {

namespace {

class RefBackendImpl final : public RefBackend {
 public:
  RefBackendImpl(ModelSpec spec, ModelWeights w, RefOptions opt)
      : spec_(std::move(spec)),
        w_(std::move(w)),
        pool_(opt.threads),
        cache_((check_ref_spec(spec_), spec_), opt.num_cache_blocks),
        rope_(spec_.rotary_dim, spec_.rope_theta),
        codecs_(make_cache_codecs(spec_, opt.cache)),
        ffn_tap_(std::move(opt.ffn_tap)) {
    check_ref_weights(spec_, w_);
  }
  std::string name() const override { return "cpu-ref"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return cache_.block_size(); }
  int num_cache_blocks() const override { return cache_.num_blocks(); }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override { return run(batch, nullptr, trace); }

  StepOutput step_following(const StepBatch& batch, const SelectionTrace& decisions, const FollowOptions& opt,
                            FollowStats* stats, SelectionTrace* trace) override {
    M3_CHECK(stats != nullptr, "step_following: no stats to report into");
    M3_CHECK(opt.block_tie_rel >= 0 && opt.expert_tie_rel >= 0, "step_following: tie tolerances must be >= 0 (got {}, {})",
             opt.block_tie_rel, opt.expert_tie_rel);
    FollowStats st;  // merged only when the step succeeds
    Follow f{&decisions, opt, &st};
    StepOutput out = run(batch, &f, trace);
    stats->merge(st);
    return out;
  }

 private:
  StepOutput run(const StepBatch& batch, const Follow* follow, SelectionTrace* trace) {
    validate_sampling_requests(batch);
    StepPlan plan = plan_step(spec_, cache_, batch);
    for (int t = 0; t < plan.num_tokens; ++t) cache_.mark_written(plan.slot[size_t(t)], plan.pos[size_t(t)]);
    ForwardContext c{spec_, w_, cache_, rope_, pool_, codecs_.exact() ? nullptr : &codecs_, follow,
                     ffn_tap_ ? &ffn_tap_ : nullptr};
    StepOutput out = forward_step(c, plan, trace);
    sample_step_on_host(batch, out);  // exact: sample_token on these logits (SeqStep::sample)
    return out;
  }


  ModelSpec spec_;
  ModelWeights w_;
  ThreadPool pool_;
  PagedCache cache_;
  Rope rope_;
  CacheCodecs codecs_;
  FfnInputTap ffn_tap_;
};

}  // namespace

std::unique_ptr<RefBackend> make_ref_backend(ModelSpec spec, ModelWeights weights, RefOptions opt) {
  M3_CHECK(opt.threads >= 0, "reference backend: threads must be >= 0, got {}", opt.threads);
  return std::make_unique<RefBackendImpl>(std::move(spec), std::move(weights), opt);
}

}  // namespace m3::ref
