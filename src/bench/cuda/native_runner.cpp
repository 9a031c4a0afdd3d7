// The "native" bench path (step_runner.h): the native forward (native/forward.h) over the run's
// random prepared weights (StepEnv::weights, the arena itself) and its random-filled cache (the
// stream path and this one read the same bytes), through the same plans CudaBackend executes.
//
// Decode case (B rows at context L): row r's table is row_block_table(c, r); its history is the
// random cache contents at positions [0, L) (no validation against a written-position map: that
// is the serving backend's); the bucket's metadata and token ids are uploaded once, and enqueue()
// enqueues the bucket plan (what CudaBackend replays as its decode graph: layers, final norm,
// lm_head into device logits; not the metadata upload nor the logits copy) for the harness to
// capture and replay; every replay rewrites position L of every row.
// Prefill case (T tokens): one request at positions [0, T) as one eager pass: metadata upload, the
// pass plan built and run, the last row's lm_head, its logits to the host (timed with events).
// One forward serves every case: launches are sized for the longest case (max_model_len), as a
// server's backend sizes them for its max_model_len.
#include <cctype>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "bench/cuda/step_runner.h"
#include "mono/mono.h"
#include "native/aux_capture.h"
#include "native/cuda_backend.h"
#include "native/cuda_check.h"
#include "native/forward.h"
#include "native/gather_rows.h"
#include "native/linear.h"
#include "native/prepared.h"

namespace m3::bench {

namespace {

// Forwards the plan's ops to the harness's recorder (one mark per change of stage or layer);
// optionally copies each MoE layer's routed expert ids into a device buffer ([layer][rows *
// top_k] int32, stride ids per layer).
class Observer final : public native::PlanObserver {
 public:
  Observer(OpRecorder* rec, int32_t* route = nullptr, int64_t stride = 0) : rec_(rec), route_(route), stride_(stride) {}
  void before(const native::OpCall& op, cudaStream_t s) override {
    if (!rec_ || (op.stage == stage_ && op.layer == layer_)) return;
    stage_ = op.stage;
    layer_ = op.layer;
    rec_->mark(s, op.stage, op.layer);
  }
  void before_runner(const native::LayerRangeRunner& r, native::LayerRange, cudaStream_t s) override {
    if (!rec_) return;
    runner_name_ = r.name();
    stage_ = runner_name_.c_str();
    layer_ = -1;
    rec_->mark(s, stage_, -1);
  }
  void after(const native::OpCall& op, cudaStream_t s) override {
    if (!route_) return;
    const kernels::RouterSelectParams* sp = nullptr;
    if (op.kind == native::OpKind::MoeRoute) sp = &std::get<kernels::MoeRouteParams>(op.params).select;
    if (op.kind == native::OpKind::RouterSelect) sp = &std::get<kernels::RouterSelectParams>(op.params);
    if (op.kind == native::OpKind::RouterGemvRoute) sp = &std::get<kernels::RouterGemvRouteParams>(op.params).route.select;
    if (!sp) return;
    M3_CHECK(int64_t(sp->M) * sp->K <= stride_, "bench native: {} x {} routed ids exceed the buffer's {}", sp->M, sp->K,
             stride_);
    M3_CUDA_CHECK(cudaMemcpyAsync(route_ + int64_t(op.layer) * stride_, sp->ids, size_t(sp->M) * size_t(sp->K) * 4,
                                  cudaMemcpyDeviceToDevice, s));
  }

 private:
  OpRecorder* rec_;
  int32_t* route_;
  int64_t stride_;
  const char* stage_ = nullptr;
  int layer_ = -2;
  std::string runner_name_;
};

int pow2_at_least(int n) {
  int b = 1;
  while (b < n) b <<= 1;
  return b;
}

// mono: the same forward with the mono runtime (mono/mono.h) running the sparse layer range of
// decode steps (prefill cases stay native); its set-up step is checked bitwise against the native
// plan's logits of the same step.
class NativeRunner final : public StepRunner {
 public:
  NativeRunner(const StepEnv& env, bool mono, mono::MonoOptions mo = {}, std::string name = "native")
      : env_(env), mono_(mono), mono_opt_(std::move(mo)), name_(std::move(name)) {
    M3_CHECK(env.weights != nullptr && env.cache != nullptr && env.spec != nullptr,
             "bench native: the run gives no prepared weights / cache (StepEnv::weights, cache)");
    const ModelSpec& spec = *env.spec;
    const native::KvCacheShape& sh = env.cache->shape();
    int64_t len = env.max_len > 0 ? env.max_len : sh.num_slots();
    if (spec.max_positions > 0) len = std::min<int64_t>(len, spec.max_positions);
    native::ForwardOptions o;
    o.max_model_len = int(std::min<int64_t>(len, INT32_MAX));
    max_batch_ = pow2_at_least(std::max(1, env.max_batch));
    o.max_tokens = int(std::max<int64_t>({int64_t(max_batch_), env.max_prefill, 16}));
    o.max_seqs = o.max_tokens;
    o.logits_rows = std::max(256, max_batch_);
    o.launch.pdl = native::pdl_default();
    fw_ = std::make_unique<native::Forward>(env.weights, *env.cache, o);
    if (mono_) {
      mono::MonoOptions mo = mono_opt_;
      mo.trace = !env.trace.empty();
      auto r = mono::create(fw_->model(), mo);
      if (auto* refusal = std::get_if<mono::Refusal>(&r)) M3_FAIL("bench mono: {}", refusal->text());
      runner_ = std::move(std::get<std::unique_ptr<mono::MonoRunner>>(r));
    }
    if (!env.aux_layers.empty())
      aux_ = native::DevBuf(size_t(max_batch_) * 4 * env.aux_layers.size() * size_t(spec.hidden) * 4);
    stride_ = int64_t(o.max_tokens) * spec.top_k;
    M3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&route_), size_t(spec.num_layers) * size_t(stride_) * 4));
  }
  ~NativeRunner() override {
    runner_.reset();
    fw_.reset();
    if (route_) cudaFree(route_);
  }

  std::string name() const override { return name_; }

  void setup(const BenchCase& c, cudaStream_t s) override {
    const ModelSpec& spec = *env_.spec;
    const int bs = spec.index_block;
    c_ = c;
    host_logits_.clear();
    tables_.clear();
    M3_CUDA_CHECK(cudaMemsetAsync(route_, 0xff, size_t(spec.num_layers) * size_t(stride_) * 4, s));  // -1: none
    Observer obs(nullptr, route_, stride_);
    if (c.is_prefill()) {
      M3_CHECK(c.prefill <= fw_->options().max_tokens,
               "bench native: prefill of {} tokens exceeds the forward's pass of {} rows (StepEnv::max_prefill)",
               c.prefill, fw_->options().max_tokens);
      tables_.push_back(row_block_table(c, bs, 0));
      rows_ = int(c.prefill);
      run_prefill(s, &obs);  // warm-up
    } else {
      M3_CHECK(c.batch <= max_batch_, "bench native: batch {} exceeds the largest decode bucket {} (StepEnv::max_batch)",
               c.batch, max_batch_);
      std::vector<native::SeqRows> rows;
      std::vector<int32_t> ids;
      for (int r = 0; r < c.batch; ++r) tables_.push_back(row_block_table(c, bs, r));
      for (int r = 0; r < c.batch; ++r) {
        rows.push_back(native::SeqRows{int32_t(c.context), c.query, tables_[size_t(r)]});
        for (int k = 0; k < c.query; ++k) ids.push_back(int32_t((1 + 7919 * int64_t(r) + 31 * k) % spec.vocab_size));
      }
      bucket_ = native::decode_bucket(c.batch) * c.query;  // token rows of the bucket plan (verify: q a row)
      native::StepMetadata m = native::build_step_metadata(rows, bs, env_.cache->shape().num_blocks, bucket_);
      // tables at the bucket width (as CudaBackend pads them): launches sized for max_model_len
      const int W = fw_->table_width();
      std::vector<int32_t> t(size_t(m.num_seqs) * size_t(W), -1);
      for (int i = 0; i < m.num_seqs; ++i)
        std::copy_n(m.block_tables.begin() + ptrdiff_t(i) * m.table_width, std::min(m.table_width, W),
                    t.begin() + ptrdiff_t(i) * W);
      m.block_tables = std::move(t);
      m.table_width = W;
      ids.resize(size_t(bucket_), 0);
      fw_->upload(m, ids, s);
      run_bucket(s, &obs, nullptr);
      rows_ = c.batch * c.query;
      if (mono_) {  // the same step through mono: bitwise the native plan's logits
        const size_t n = size_t(rows_) * size_t(spec.vocab_size);
        std::vector<float> want(n), got(n);
        M3_CUDA_CHECK(cudaMemcpyAsync(want.data(), fw_->act().logits.get(), n * 4, cudaMemcpyDeviceToHost, s));
        M3_CUDA_CHECK(cudaMemsetAsync(fw_->act().logits.get(), 0xff, n * 4, s));  // NaN poison
        run_bucket(s, nullptr, runner_.get());
        M3_CUDA_CHECK(cudaMemcpyAsync(got.data(), fw_->act().logits.get(), n * 4, cudaMemcpyDeviceToHost, s));
        M3_CUDA_CHECK(cudaStreamSynchronize(s));
        if (std::string e = runner_->take_error(); !e.empty()) M3_FAIL("bench mono: {}", e);
        mono_differ_ = 0;
        for (size_t i = 0; i < n; ++i) mono_differ_ += std::memcmp(&want[i], &got[i], 4) != 0;
        trace_summary_.clear();
        if (!env_.trace.empty()) write_trace(c);
      }
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    count_hits();
  }

  bool capturable() const override { return !c_.is_prefill(); }

  void enqueue(cudaStream_t s, OpRecorder* rec) override {
    M3_CHECK(!c_.is_prefill(), "bench native: a prefill step is not capturable (run_eager)");
    Observer obs(rec);
    run_bucket(s, rec ? &obs : nullptr, runner_.get());
  }

  // The decode bucket's plan on s, with the aux copies of --aux-layers (mono in parts around them).
  void run_bucket(cudaStream_t s, native::PlanObserver* obs, native::LayerRangeRunner* runner) {
    const native::LayerPlan& plan = fw_->bucket_plan(bucket_);
    if (env_.aux_layers.empty()) return fw_->run(plan, s, obs, runner);
    std::vector<int> cuts;
    M3_CHECK(native::aux_runner_cuts(plan, env_.aux_layers, fw_->model().sparse_range(), &cuts) || !runner,
             "bench mono: --aux-layers {} include a layer mono cannot be cut for", fmt::join(env_.aux_layers, ","));
    native::AuxCapture cap(plan, env_.aux_layers, fw_->act().x.get<float>(), env_.spec->hidden, bucket_,
                           aux_.get<float>(), obs);
    fw_->run(plan, s, &cap, runner, runner ? std::span<const int>(cuts) : std::span<const int>());
  }

  void run_eager(cudaStream_t s, OpRecorder* rec) override {
    Observer obs(rec);
    if (!c_.is_prefill()) return enqueue(s, rec);
    run_prefill(s, rec ? &obs : nullptr);
  }

  std::vector<std::pair<std::string, std::vector<std::string>>> op_groups() const override {
    return {{"moe", {"router", "experts", "shared_expert"}}};
  }

  std::vector<double> experts_hit() const override { return hits_; }

  std::string check_outputs() override {
    const int V = env_.spec->vocab_size;
    if (runner_) {
      if (std::string e = runner_->take_error(); !e.empty()) return e;
      if (mono_differ_ > 0)
        return fmt::format("mono's set-up step differs from the native plan's in {} logits (expected bitwise equal)",
                           mono_differ_);
    }
    std::vector<float> h;
    if (c_.is_prefill()) {
      h = host_logits_;
    } else {
      h.resize(size_t(rows_) * size_t(V));
      M3_CUDA_CHECK(cudaMemcpy(h.data(), fw_->act().logits.get(), h.size() * 4, cudaMemcpyDeviceToHost));
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < h.size(); ++i)
      if (!std::isfinite(h[i])) first = bad++ ? first : i;
    if (h.empty()) return "no logits";
    if (bad == 0) return "";
    return fmt::format("{} of {} logits are not finite (first: row {} column {})", bad, h.size(), first / size_t(V),
                       first % size_t(V));
  }

  std::string note() const override {
    if (mono_ && !c_.is_prefill())
      return fmt::format("decode bucket plan of {} token rows with the sparse layers in one mono launch ({}); set-up step bitwise "
                         "vs native: {} logits differ{}",
                         bucket_, runner_->describe(), mono_differ_, trace_summary_.empty() ? "" : "\n" + trace_summary_);
    if (c_.is_prefill())
      return fmt::format("one eager pass of {} rows: metadata upload, plan build, layers, last row's lm_head, logits "
                         "to the host (not a graph)",
                         c_.prefill);
    return fmt::format("decode bucket plan of {} token rows (what CudaBackend replays as its graph, without the metadata upload and "
                       "logits copy) over the random cache",
                       bucket_);
  }

 private:
  // The prefill step, eagerly on s (ends synchronized: the logits are on the host).
  void run_prefill(cudaStream_t s, native::PlanObserver* obs) {
    const ModelSpec& spec = *env_.spec;
    const int T = rows_;
    const native::SeqRows row{0, int32_t(T), tables_[0]};
    const native::StepMetadata m =
        native::build_step_metadata(std::span<const native::SeqRows>(&row, 1), spec.index_block,
                                    env_.cache->shape().num_blocks);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) ids[size_t(t)] = int32_t(t % spec.vocab_size);
    fw_->upload(m, ids, s);
    fw_->run(fw_->pass_plan(), s, obs);
    native::Activations& act = fw_->act();
    const int32_t last = T - 1;
    M3_CUDA_CHECK(cudaMemcpyAsync(act.rows.get(), &last, 4, cudaMemcpyHostToDevice, s));
    native::launch(native::make_gather_rows_params(act.a.get<float>(), spec.hidden, act.rows.get<int32_t>(), 1,
                                                   spec.hidden, act.gather.get<float>(), spec.hidden),
                   s);
    native::linear_dense(fw_->model().weights().lm_head(), native::ActIn{act.gather.get(), DType::F32, spec.hidden}, 1,
                         act.logits.get<float>(), spec.vocab_size, s);
    host_logits_.resize(size_t(spec.vocab_size));
    M3_CUDA_CHECK(cudaMemcpyAsync(host_logits_.data(), act.logits.get(), host_logits_.size() * 4,
                                  cudaMemcpyDeviceToHost, s));
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  // The set-up step's mono launch, task by task, to the --trace file of this case.
  void write_trace(const BenchCase& c) {
    const auto tr = runner_->trace();
    // one file per path (variants like mono:stage=3 get their options in the name, '/' and '=' as '_')
    std::string tag = name_;
    for (char& ch : tag)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    const std::string path = c.query > 1 ? fmt::format("{}.{}.b{}.q{}.ctx{}.csv", env_.trace, tag, c.batch, c.query, c.context)
                                         : fmt::format("{}.{}.b{}.ctx{}.csv", env_.trace, tag, c.batch, c.context);
    FILE* f = std::fopen(path.c_str(), "w");
    M3_CHECK(f != nullptr, "bench mono: --trace: cannot write {}", path);
    std::fprintf(f, "op,item,layer,code,wait_ns,run_ns,end_ns\n");
    for (const auto& t : tr)
      std::fprintf(f, "%d,%d,%d,%s,%.0f,%.0f,%.0f\n", t.op, t.item, t.layer, t.code.c_str(), t.wait_begin, t.run_begin,
                   t.end);
    std::fclose(f);
    trace_summary_ = mono::summarize_trace(tr) + "  (trace: " + path + ")";
  }

  // Distinct routed experts of the live rows per MoE layer, from the setup step's routing.
  void count_hits() {
    const ModelSpec& spec = *env_.spec;
    std::vector<int32_t> ids(size_t(spec.num_layers) * size_t(stride_));
    M3_CUDA_CHECK(cudaMemcpy(ids.data(), route_, ids.size() * 4, cudaMemcpyDeviceToHost));
    hits_.assign(size_t(spec.num_layers), 0.0);
    for (int l = 0; l < spec.num_layers; ++l) {
      if (!spec.moe(l)) continue;
      std::set<int32_t> seen;
      const int32_t* p = ids.data() + size_t(l) * size_t(stride_);
      for (int64_t i = 0; i < int64_t(rows_) * spec.top_k; ++i) {
        M3_CHECK(p[i] >= 0 && p[i] < spec.num_experts, "bench native: layer {} routed id {} outside [0, {})", l, p[i],
                 spec.num_experts);
        seen.insert(p[i]);
      }
      hits_[size_t(l)] = double(seen.size());
    }
  }

  StepEnv env_;
  bool mono_ = false;
  mono::MonoOptions mono_opt_;
  std::string name_;
  std::unique_ptr<native::Forward> fw_;
  std::unique_ptr<mono::MonoRunner> runner_;
  native::DevBuf aux_;  // --aux-layers: [rows][layers x hidden] copies
  size_t mono_differ_ = 0;
  std::string trace_summary_;
  BenchCase c_;
  std::vector<std::vector<int32_t>> tables_;
  int bucket_ = 0, rows_ = 0, max_batch_ = 1;
  int32_t* route_ = nullptr;  // [layers][stride_] routed ids of the setup step
  int64_t stride_ = 0;
  std::vector<double> hits_;
  std::vector<float> host_logits_;
};

}  // namespace

std::unique_ptr<StepRunner> make_native_runner(const StepEnv& env) { return std::make_unique<NativeRunner>(env, false); }
std::unique_ptr<StepRunner> make_mono_runner(const StepEnv& env, const mono::MonoOptions& opt, const std::string& name) {
  return std::make_unique<NativeRunner>(env, true, opt, name);
}

}  // namespace m3::bench
