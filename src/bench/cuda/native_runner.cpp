// The "native" bench path (step_runner.h): native::CudaBackend over the run's random prepared
// weights (StepEnv::weights, the arena itself) and its random-filled cache (borrowed, so the
// stream path and this one read the same bytes).
//
// Decode case (B rows at context L): row r's table is row_block_table(c, r), positions [0, L)
// are declared written (CudaBackend::assume_cache_filled: the cache holds random K/V there), the
// batch is prepared once (metadata + token ids uploaded), and enqueue() enqueues the backend's
// decode-bucket launches (CudaBackend::enqueue_decode: what step() replays as its own graph)
// for the harness to capture and replay; every replay rewrites position L of every row.
// Prefill case (T tokens): CudaBackend::step_observed of one request at positions [0, T), one
// pass (max_tokens = the longest prefill), eager: not capturable, timed with events.
// One backend serves every case: launches are sized for the longest case (max_model_len), as a
// server's backend sizes them for its max_model_len.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "bench/cuda/step_runner.h"
#include "native/cuda_backend.h"
#include "native/cuda_check.h"
#include "native/prepared.h"

namespace m3::bench {

namespace {

// Forwards the backend's ops to the harness's recorder; optionally copies each MoE layer's routed
// expert ids into a device buffer ([layer][rows * top_k] int32, stride ids per layer).
class Observer final : public native::StepObserver {
 public:
  Observer(OpRecorder* rec, int32_t* route = nullptr, int64_t stride = 0) : rec_(rec), route_(route), stride_(stride) {}
  void before_op(cudaStream_t s, const char* op, int layer) override {
    if (rec_) rec_->mark(s, op, layer);
  }
  void after_moe(cudaStream_t s, int layer, const int32_t* ids, int rows, int top_k) override {
    if (!route_) return;
    M3_CHECK(int64_t(rows) * top_k <= stride_, "bench native: {} x {} routed ids exceed the buffer's {}", rows, top_k,
             stride_);
    M3_CUDA_CHECK(cudaMemcpyAsync(route_ + int64_t(layer) * stride_, ids, size_t(rows) * size_t(top_k) * 4,
                                  cudaMemcpyDeviceToDevice, s));
  }

 private:
  OpRecorder* rec_;
  int32_t* route_;
  int64_t stride_;
};

int pow2_at_least(int n) {
  int b = 1;
  while (b < n) b <<= 1;
  return b;
}

class NativeRunner final : public StepRunner {
 public:
  explicit NativeRunner(const StepEnv& env) : env_(env) {
    M3_CHECK(env.weights != nullptr && env.cache != nullptr && env.spec != nullptr,
             "bench native: the run gives no prepared weights / cache (StepEnv::weights, cache)");
    const ModelSpec& spec = *env.spec;
    const native::KvCacheShape& sh = env.cache->shape();
    native::CudaBackendOptions o;
    o.kv_dtype = sh.kv_dtype;
    o.ik_dtype = sh.ik_dtype;
    o.cuda_graphs = false;  // the harness captures the bucket launches itself
    int64_t len = env.max_len > 0 ? env.max_len : sh.num_slots();
    if (spec.max_positions > 0) len = std::min<int64_t>(len, spec.max_positions);
    o.max_model_len = int(std::min<int64_t>(len, INT32_MAX));
    o.max_graph_batch = pow2_at_least(std::max(1, env.max_batch));
    o.max_tokens = int(std::max<int64_t>({int64_t(o.max_graph_batch), env.max_prefill, 16}));
    o.logits_rows = std::max(256, o.max_graph_batch);
    backend_ = native::make_cuda_backend(env.weights, o, env.cache);
    stride_ = int64_t(o.max_tokens) * spec.top_k;
    M3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&route_), size_t(spec.num_layers) * size_t(stride_) * 4));
  }
  ~NativeRunner() override {
    backend_.reset();
    if (route_) cudaFree(route_);
  }

  std::string name() const override { return "native"; }

  void setup(const BenchCase& c, cudaStream_t s) override {
    const ModelSpec& spec = *env_.spec;
    const int bs = spec.index_block;
    c_ = c;
    batch_ = StepBatch{};
    host_logits_.clear();
    M3_CUDA_CHECK(cudaMemsetAsync(route_, 0xff, size_t(spec.num_layers) * size_t(stride_) * 4, s));  // -1: none
    Observer obs(nullptr, route_, stride_);
    if (c.is_prefill()) {
      M3_CHECK(c.prefill <= backend_->options().max_tokens,
               "bench native: prefill of {} tokens exceeds the backend's pass of {} rows (StepEnv::max_prefill)",
               c.prefill, backend_->options().max_tokens);
      SeqStep q;
      q.start_pos = 0;
      q.tokens.resize(size_t(c.prefill));
      for (int64_t t = 0; t < c.prefill; ++t) q.tokens[size_t(t)] = int32_t(t % spec.vocab_size);
      q.block_table = row_block_table(c, bs, 0);
      batch_.seqs.push_back(std::move(q));
      StepOutput out = backend_->step_observed(batch_, s, &obs);  // warm-up: cuBLASLt, scratch
      host_logits_ = std::move(out.logits);
      rows_ = int(c.prefill);
    } else {
      M3_CHECK(c.batch <= backend_->options().max_graph_batch,
               "bench native: batch {} exceeds the backend's largest decode bucket {} (StepEnv::max_batch)", c.batch,
               backend_->options().max_graph_batch);
      for (int r = 0; r < c.batch; ++r) {
        SeqStep q;
        q.start_pos = int32_t(c.context);
        q.tokens = {int32_t((1 + 7919 * int64_t(r)) % spec.vocab_size)};
        q.block_table = row_block_table(c, bs, r);
        backend_->assume_cache_filled(q.block_table, c.context);
        batch_.seqs.push_back(std::move(q));
      }
      bucket_ = backend_->prepare_decode(batch_);
      backend_->enqueue_decode(s, &obs);
      rows_ = c.batch;
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    count_hits();
  }

  bool capturable() const override { return !c_.is_prefill(); }

  void enqueue(cudaStream_t s, OpRecorder* rec) override {
    M3_CHECK(!c_.is_prefill(), "bench native: a prefill step is not capturable (run_eager)");
    Observer obs(rec);
    backend_->enqueue_decode(s, rec ? &obs : nullptr);
  }

  void run_eager(cudaStream_t s, OpRecorder* rec) override {
    Observer obs(rec);
    if (!c_.is_prefill()) {
      backend_->enqueue_decode(s, rec ? &obs : nullptr);
      return;
    }
    StepOutput out = backend_->step_observed(batch_, s, rec ? &obs : nullptr);
    host_logits_ = std::move(out.logits);
  }

  std::vector<std::pair<std::string, std::vector<std::string>>> op_groups() const override {
    return {{"moe", {"router", "experts", "shared_expert"}}};
  }

  std::vector<double> experts_hit() const override { return hits_; }

  std::string check_outputs() override {
    const int V = env_.spec->vocab_size;
    std::vector<float> h;
    if (c_.is_prefill()) {
      h = host_logits_;
    } else {
      h.resize(size_t(c_.batch) * size_t(V));
      M3_CUDA_CHECK(cudaMemcpy(h.data(), backend_->device_logits(), h.size() * 4, cudaMemcpyDeviceToHost));
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
    if (c_.is_prefill())
      return fmt::format("CudaBackend::step eager, one pass of {} rows, host validation + metadata included (not a "
                         "graph)",
                         c_.prefill);
    return fmt::format("CudaBackend decode bucket {} (the launches its own graph replays, without the metadata upload "
                       "and logits copy), history declared written over the random cache",
                       bucket_);
  }

 private:
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
  std::unique_ptr<native::CudaBackend> backend_;
  BenchCase c_;
  StepBatch batch_;
  int bucket_ = 0, rows_ = 0;
  int32_t* route_ = nullptr;  // [layers][stride_] routed ids of the setup step
  int64_t stride_ = 0;
  std::vector<double> hits_;
  std::vector<float> host_logits_;
};

}  // namespace

std::unique_ptr<StepRunner> make_native_runner(const StepEnv& env) { return std::make_unique<NativeRunner>(env); }

}  // namespace m3::bench
