// RefBackend: owns the spec, fp32 weights, the paged caches and a thread pool; step() plans
// (validates) the batch, marks the slots it writes, then runs forward_step.
#include "ref/engine.h"

#include "core/check.h"
#include "ref/check_model.h"
#include "ref/forward.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"

namespace m3::ref {

namespace {

class RefBackend final : public Backend {
 public:
  RefBackend(ModelSpec spec, ModelWeights w, RefOptions opt)
      : spec_(std::move(spec)),
        w_(std::move(w)),
        pool_(opt.threads),
        cache_((check_ref_spec(spec_), spec_), opt.num_cache_blocks),
        rope_(spec_.rotary_dim, spec_.rope_theta) {
    check_ref_weights(spec_, w_);
  }
  std::string name() const override { return "cpu-ref"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return cache_.block_size(); }
  int num_cache_blocks() const override { return cache_.num_blocks(); }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    StepPlan plan = plan_step(spec_, cache_, batch);
    for (int t = 0; t < plan.num_tokens; ++t) cache_.mark_written(plan.slot[size_t(t)], plan.pos[size_t(t)]);
    ForwardContext c{spec_, w_, cache_, rope_, pool_};
    return forward_step(c, plan, trace);
  }

 private:
  ModelSpec spec_;
  ModelWeights w_;
  ThreadPool pool_;
  PagedCache cache_;
  Rope rope_;
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend(ModelSpec spec, ModelWeights weights, RefOptions opt) {
  M3_CHECK(opt.threads >= 0, "reference backend: threads must be >= 0, got {}", opt.threads);
  return std::make_unique<RefBackend>(std::move(spec), std::move(weights), opt);
}

}  // namespace m3::ref
