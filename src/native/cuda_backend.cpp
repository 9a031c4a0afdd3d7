// CudaBackend (native/cuda_backend.h): the step's validation (runtime/step_check.h, once), the
// path choice (runtime/dispatcher.h), chunking into passes of at most max_tokens rows, the padded
// decode buckets and their CUDA graphs (native/graph_cache.h), logits and samples back to the
// host. The forward of a pass is a plan (native/forward.h) executed op by op.
#include "native/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "native/aux_capture.h"
#include "native/collective.h"
#include "native/cuda_check.h"
#include "native/device_comm.h"
#include "native/forward.h"
#include "native/gather_rows.h"
#include "native/graph_cache.h"
#include "native/kv_cache.h"
#include "native/layer_range.h"
#include "native/linear.h"
#include "native/prepared.h"
#include "native/step_samples.h"
#include "native/step_trace.h"
#include "runtime/step_check.h"
#include "runtime/step_sampling.h"

namespace m3::native {

namespace {

constexpr int kMaxBuckets = 16;  // bucket i holds 2^i rows

// A pass: rows of several sequences, each with its new tokens, plus which rows return logits.
struct Pass {
  std::vector<SeqRows> seqs;
  std::vector<int32_t> ids;       // [rows] token ids
  std::vector<int32_t> out_rows;  // rows (in pass order) that return logits, in output order
  struct Segment {
    int seq, first, count, row0;  // tokens [first, first + count) of batch sequence seq at pass row row0
  };
  std::vector<Segment> segments;
};

// Per cache slot: the position it holds, -1 = nothing.
class WrittenSlots final : public SlotHistory {
 public:
  explicit WrittenSlots(int64_t slots) : pos_(size_t(slots), -1) {}
  int32_t written(int64_t slot) const override { return pos_[size_t(slot)]; }
  void mark(int64_t slot, int32_t pos) { pos_[size_t(slot)] = pos; }

 private:
  std::vector<int32_t> pos_;
};

CudaBackendOptions checked(CudaBackendOptions o, const ModelSpec& spec, DeviceKvCache* borrowed) {
  if (borrowed) o.num_cache_blocks = borrowed->shape().num_blocks;
  M3_CHECK(o.num_cache_blocks > 0, "cuda backend: num_cache_blocks must be > 0, got {}", o.num_cache_blocks);
  M3_CHECK(o.max_tokens > 0, "cuda backend: max_tokens must be > 0, got {}", o.max_tokens);
  M3_CHECK(o.logits_rows > 0, "cuda backend: logits_rows must be > 0, got {}", o.logits_rows);
  M3_CHECK(o.max_graph_batch >= 1 && (o.max_graph_batch & (o.max_graph_batch - 1)) == 0 &&
               o.max_graph_batch <= o.max_tokens && o.max_graph_batch < (1 << kMaxBuckets),
           "cuda backend: max_graph_batch {} must be a power of two <= max_tokens {}", o.max_graph_batch, o.max_tokens);
  int64_t cap = int64_t(o.num_cache_blocks) * spec.index_block;
  if (spec.max_positions > 0) cap = std::min<int64_t>(cap, spec.max_positions);
  if (o.max_model_len <= 0) o.max_model_len = int(std::min<int64_t>(cap, INT32_MAX));
  M3_CHECK(o.max_model_len <= cap, "cuda backend: max_model_len {} exceeds what the cache / model allow ({})",
           o.max_model_len, cap);
  M3_CHECK(spec.hidden % 4 == 0 && spec.q_dim() % 4 == 0,
           "cuda backend: hidden {} and q_dim {} must be multiples of 4 (16-byte activation rows)", spec.hidden,
           spec.q_dim());
  o.logits_rows = std::max(o.logits_rows, o.max_graph_batch);
  return o;
}

// The cache this backend uses: the borrowed one (its shape checked) or its own.
DeviceKvCache* cache_for(const ModelSpec& spec, const CudaBackendOptions& o, DeviceKvCache* borrowed,
                         std::unique_ptr<DeviceKvCache>& own) {
  const KvCacheShape shape = kv_cache_shape(spec, o.num_cache_blocks, o.kv_dtype, o.ik_dtype);
  if (!borrowed) {
    own = std::make_unique<DeviceKvCache>(shape);
    return own.get();
  }
  const KvCacheShape& b = borrowed->shape();
  M3_CHECK(b.num_layers == shape.num_layers && b.block_size == shape.block_size && b.kv_heads == shape.kv_heads &&
               b.head_dim == shape.head_dim && b.index_dim == shape.index_dim && b.kv_dtype == shape.kv_dtype &&
               b.ik_dtype == shape.ik_dtype && b.has_index == shape.has_index,
           "cuda backend: the borrowed cache's shape does not match the model's ({} layers, block {}, {} KV heads x "
           "{}, index dim {}, {} / {})",
           shape.num_layers, shape.block_size, shape.kv_heads, shape.head_dim, shape.index_dim,
           dtype_name(shape.kv_dtype), dtype_name(shape.ik_dtype));
  return borrowed;
}

const ModelSpec& spec_of(const std::shared_ptr<const PreparedWeights>& w) {
  M3_CHECK(w != nullptr, "cuda backend: no prepared weights");
  return w->spec();
}
// The shapes one rank computes with (the cache's heads); the weights must be the comm's rank.
ModelSpec rank_spec_of(const PreparedWeights& w, const DeviceComm* comm) {
  return prepared_rank_spec(w.layout(), comm ? comm->rank() : 0, comm ? comm->size() : 1, "cuda backend");
}

int select_device(int device) {
  if (device >= 0) M3_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(std::shared_ptr<const PreparedWeights> w, const CudaBackendOptions& opt,
                  DeviceKvCache* borrowed_cache = nullptr)
      : device_(select_device(opt.device)),
        spec_(spec_of(w)),
        rank_spec_(rank_spec_of(*w, opt.comm.get())),
        opt_(checked(opt, rank_spec_, borrowed_cache)),
        cache_(cache_for(rank_spec_, opt_, borrowed_cache, own_cache_)),
        fw_(std::move(w), *cache_,
            ForwardOptions{opt_.max_tokens, opt_.max_model_len, opt_.max_tokens, opt_.logits_rows, {opt_.pdl},
                           opt_.comm.get()}),
        written_(cache_->shape().num_slots()),
        samples_(spec_.vocab_size) {
    M3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int l = 0; l < spec_.num_layers; ++l)
      cache_->set_scales(l, opt_.k_scale, opt_.v_scale, spec_.sparse(l) ? opt_.ik_scale : 1.0f);
    if (!opt_.cuda_graphs || (opt_.comm && !opt_.comm->capturable())) graphs_.disable();
  }

  ~CudaBackendImpl() override {
    graphs_.clear();  // before the runners whose launches they captured
    runners_.clear();
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  std::string name() const override {
    return opt_.comm ? fmt::format("cuda-native tp{} rank {} ({})", opt_.comm->size(), opt_.comm->rank(),
                                   opt_.comm->name())
                     : std::string("cuda-native");
  }
  const ModelSpec& spec() const override { return spec_; }
  bool returns_aux() const override { return true; }
  int cache_block_size() const override { return spec_.index_block; }
  int num_cache_blocks() const override { return opt_.num_cache_blocks; }
  DeviceKvCache& kv_cache() override { return *cache_; }
  const CudaBackendOptions& options() const override { return opt_; }
  CudaBackendStats stats() const override { return stats_; }
  void set_block_score_trace(BlockScoreTrace* s) override { score_trace_ = s; }
  const Dispatcher& dispatcher() const override { return dispatcher_; }
  const ForwardModel& model() const override { return fw_.model(); }
  void set_arrival_counters(uint8_t byte) override {
    const Activations& a = fw_.act();
    for (const DevBuf* b : {&a.route_arrivals, &a.rope_arrivals, &a.combine_arrivals})
      M3_CUDA_CHECK(cudaMemsetAsync(b->get(), byte, b->bytes(), stream_));
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void add_layer_range_runner(std::unique_ptr<LayerRangeRunner> runner) override {
    M3_CHECK(runner != nullptr, "cuda backend: no layer range runner");
    LayerRangeRunner* r = runner.get();
    const std::string name = r->name();
    dispatcher_.add_preferred_path(name, [this, r](const StepBatch& b) -> std::string {
      if (tracing_) return "traced";
      if (!b.aux_layers.empty()) {  // hidden states copied where the runner's range can be cut for them
        const int q = bucket_query_len(b, BucketLimits{opt_.max_graph_batch, opt_.max_tokens, opt_.logits_rows}, false);
        std::vector<int> cuts;
        if (q <= 0 || !aux_runner_cuts(fw_.bucket_plan(decode_bucket(int(b.seqs.size())) * q), b.aux_layers,
                                       fw_.model().sparse_range(), &cuts))
          return "aux";
      }
      return r->refusal(b);
    });
    runners_.emplace(name, std::move(runner));
  }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    const std::vector<CheckedSeq> seqs = validate(batch);
    validate_sampling_requests(batch);
    tracing_ = trace != nullptr;
    const PathChoice choice = dispatcher_.choose(batch);
    LayerRangeRunner* runner = choice.name == "native" ? nullptr : runners_.at(choice.name).get();
    ++stats_.steps;
    StepOutput out;
    out.vocab = spec_.vocab_size;
    out.path = choice.name;
    out.fallback_reason = choice.fallback_reason;
    int rows = 0;
    bool copy_logits = false;  // skipped when every sequence samples here and none wants logits
    for (const SeqStep& s : batch.seqs) {
      out.first_row.push_back(rows);
      const int n = s.all_logits ? int(s.tokens.size()) : 1;
      out.num_rows.push_back(n);
      rows += n;
      copy_logits = copy_logits || s.want_logits || !s.sample;
    }
    samples_.begin(batch);
    aux_begin(batch, out);
    if (copy_logits) out.logits.resize(size_t(rows) * size_t(spec_.vocab_size));
    float* host_logits = copy_logits ? out.logits.data() : nullptr;

    const int q = bucket_query_len(batch, BucketLimits{opt_.max_graph_batch, opt_.max_tokens, opt_.logits_rows},
                                   trace != nullptr);
    auto run = [&](int path, LayerRangeRunner* r) {
      if (q > 0) {
        run_decode(batch, seqs, q, host_logits, path, r, out);
      } else {
        std::unique_ptr<StepTraceRecorder> rec;
        if (trace) {
          rec = std::make_unique<StepTraceRecorder>(fw_, trace, score_trace_);
          rec->begin();
        }
        run_chunked(batch, seqs, host_logits, rec.get(), r, out);
      }
    };
    std::string err;
    if (!runner) {
      run(choice.path, nullptr);
    } else {
      try {
        run(choice.path, runner);
        err = runner->take_error();
      } catch (const Error& e) {  // e.g. a refusal found when its tables were built: the runner is broken now
        M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
        err = e.what();
      }
    }
    if (runner) {
      if (!err.empty()) {  // the runner failed this step: native re-runs all of it (same slots, same values)
        fmt::print(stderr, "cuda backend: path {} failed a step, re-running it natively: {}\n", choice.name, err);
        dispatcher_.count_failure(choice.name, "fault");
        out.path = "native";
        out.fallback_reason = choice.name + ":fault";
        fw_.act().reset_counters(stream_);  // the runner may have stopped inside a fused op (arrivals)
        run(int(dispatcher_.path_names().size()) - 1, nullptr);
      }
    }
    if (!samples_.empty()) out.tokens = samples_.collect(batch, stream_);
    // Only now (every launch succeeded) do the new positions count as written.
    for (const CheckedSeq& s : seqs)
      for (int j = 0; j < s.num_new; ++j) {
        const int32_t pos = s.start_pos + j;
        written_.mark(slot_of(s.table, pos, spec_.index_block), pos);
      }
    return out;
  }

 private:
  std::vector<CheckedSeq> validate(const StepBatch& batch) const {
    StepLimits lim;
    lim.vocab_size = spec_.vocab_size;
    lim.block_size = spec_.index_block;
    lim.num_blocks = opt_.num_cache_blocks;
    lim.max_len = opt_.max_model_len;
    lim.max_len_name = "max_model_len";
    lim.num_layers = spec_.num_layers;
    return check_step(batch, lim, written_, HistoryCheck::BlockEnds);
  }

  // ---- auxiliary hidden states (native/aux_capture.h) ----

  // The step's aux rows on the host (out.aux, rows of the sequences that want them, in batch
  // order) and the device buffer the plans' copies write ([max_tokens][width]).
  void aux_begin(const StepBatch& batch, StepOutput& out) {
    aux_layers_ = batch.aux_layers;
    if (aux_layers_.empty()) return;
    out.aux_width = int(aux_layers_.size()) * spec_.hidden;
    int rows = 0;
    for (const SeqStep& s : batch.seqs) {
      out.aux_first_row.push_back(s.want_aux ? rows : -1);
      if (s.want_aux) rows += int(s.tokens.size());
    }
    out.aux.assign(size_t(rows) * size_t(out.aux_width), 0.0f);
    const size_t bytes = size_t(opt_.max_tokens) * size_t(out.aux_width) * 4;
    if (aux_dev_.bytes() < bytes) {
      graphs_.clear();  // graphs that captured copies into the old buffer
      aux_dev_ = DevBuf(bytes);
    }
    auto it = std::find(aux_variants_.begin(), aux_variants_.end(), aux_layers_);
    if (it == aux_variants_.end()) it = aux_variants_.insert(aux_variants_.end(), aux_layers_);
    aux_variant_ = int(it - aux_variants_.begin()) + 1;
  }
  // Device rows [row0, row0 + count) of the aux buffer to host rows from `host_row` of out.aux.
  void aux_to_host(StepOutput& out, int row0, int count, int host_row) {
    const size_t w = size_t(out.aux_width);
    M3_CUDA_CHECK(cudaMemcpyAsync(out.aux.data() + size_t(host_row) * w, aux_dev_.get<float>() + size_t(row0) * w,
                                  size_t(count) * w * 4, cudaMemcpyDeviceToHost, stream_));
  }

  static SeqRows rows_of(const CheckedSeq& s) { return SeqRows{s.start_pos, s.num_new, s.table}; }

  // lm_head over R rows of src (fp32 [R][H]) into the logits buffer (the step's output rows g0 ..
  // g0 + R - 1), sampling the requested ones there; then to the host unless host is null.
  void lm_head_to_host(const float* src, int R, float* host, int g0) {
    Activations& act = fw_.act();
    const DenseWeight lm = fw_.model().weights().lm_head();
    const int V = spec_.vocab_size;
    for (int r0 = 0; r0 < R; r0 += act.logits_rows) {
      const int r = std::min(act.logits_rows, R - r0);
      const ActIn in{src + size_t(r0) * spec_.hidden, DType::F32, spec_.hidden};
      if (DeviceComm* c = opt_.comm.get()) {  // this rank's vocabulary columns, then every rank's
        linear_dense(lm, in, r, act.logits_local.get<float>(), lm.rows, stream_);
        launch(make_vocab_gather_params(c, act.logits_local.get<float>(), r, lm.rows, act.tp_gather.get<float>(),
                                        act.logits.get<float>(), V),
               stream_);
      } else {
        linear_dense(lm, in, r, act.logits.get<float>(), V, stream_);
      }
      samples_.launch_rows(act.logits.get<float>(), g0 + r0, r, stream_);
      if (host)
        M3_CUDA_CHECK(cudaMemcpyAsync(host + size_t(r0) * V, act.logits.get(), size_t(r) * V * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    }
  }

  // ---- eager passes (prefill, mixed, large or traced batches) ----

  void run_chunked(const StepBatch& batch, const std::vector<CheckedSeq>& seqs, float* logits, StepTraceRecorder* rec,
                   LayerRangeRunner* runner, StepOutput& out) {
    // Flatten, then cut into passes of at most max_tokens rows.
    Pass pass;
    int out_row = 0;
    auto flush = [&] {
      if (pass.ids.empty()) return;
      const int R = int(pass.out_rows.size());
      run_pass(pass, logits ? logits + size_t(out_row) * spec_.vocab_size : nullptr, rec, runner, out_row, batch, out);
      out_row += R;
      pass = Pass{};
    };
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqStep& q = batch.seqs[i];
      const int n = int(q.tokens.size());
      for (int j = 0; j < n;) {
        if (int(pass.ids.size()) == opt_.max_tokens) flush();
        const int take = std::min(n - j, opt_.max_tokens - int(pass.ids.size()));
        SeqRows r = rows_of(seqs[i]);
        r.start_pos = seqs[i].start_pos + j;
        r.num_new = take;
        const int64_t need = (int64_t(r.start_pos) + take + spec_.index_block - 1) / spec_.index_block;
        r.block_table = seqs[i].table.subspan(0, size_t(need));
        const int row0 = int(pass.ids.size());
        for (int k = 0; k < take; ++k) {
          pass.ids.push_back(q.tokens[size_t(j + k)]);
          if (q.all_logits || j + k == n - 1) pass.out_rows.push_back(row0 + k);
        }
        pass.seqs.push_back(r);
        pass.segments.push_back(Pass::Segment{int(i), j, take, row0});
        j += take;
      }
    }
    flush();
  }

  void run_pass(const Pass& pass, float* logits, StepTraceRecorder* rec, LayerRangeRunner* runner, int out_row0,
                const StepBatch& batch, StepOutput& out) {
    ++stats_.eager_passes;
    const StepMetadata m = build_step_metadata(pass.seqs, spec_.index_block, opt_.num_cache_blocks);
    fw_.upload(m, pass.ids, stream_);
    if (rec) rec->set_pass(m.num_tokens, &m.positions, &m.slots);
    const LayerPlan plan = fw_.pass_plan();
    Activations& act = fw_.act();
    if (aux_layers_.empty()) {
      fw_.run(plan, stream_, rec, runner);
    } else {
      std::vector<int> cuts;
      M3_CHECK(aux_runner_cuts(plan, aux_layers_, fw_.model().sparse_range(), &cuts) || !runner,
               "cuda backend: aux layers {} include one whose hidden state the {} path cannot leave between its parts",
               fmt::join(aux_layers_, ","), runner ? runner->name() : "");
      AuxCapture cap(plan, aux_layers_, act.x.get<float>(), spec_.hidden, m.num_tokens, aux_dev_.get<float>(), rec);
      fw_.run(plan, stream_, &cap, runner, runner ? std::span<const int>(cuts) : std::span<const int>());
      for (const Pass::Segment& g : pass.segments)
        if (batch.seqs[size_t(g.seq)].want_aux) aux_to_host(out, g.row0, g.count, out.aux_first_row[size_t(g.seq)] + g.first);
    }
    const int R = int(pass.out_rows.size());
    M3_CUDA_CHECK(cudaMemcpyAsync(act.rows.get(), pass.out_rows.data(), size_t(R) * 4, cudaMemcpyHostToDevice, stream_));
    // Gather the output rows in groups that fit the gather buffer, lm_head each group.
    const int gcap = int(act.gather.bytes() / (size_t(spec_.hidden) * 4));
    for (int r0 = 0; r0 < R; r0 += gcap) {
      const int r = std::min(gcap, R - r0);
      launch(make_gather_rows_params(act.a.get<float>(), spec_.hidden, act.rows.get<int32_t>() + r0, r, spec_.hidden,
                                     act.gather.get<float>(), spec_.hidden),
             stream_);
      lm_head_to_host(act.gather.get<float>(), r, logits ? logits + size_t(r0) * spec_.vocab_size : nullptr,
                      out_row0 + r0);
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ---- decode buckets ----

  // Metadata of a decode bucket: padded to T token rows, tables padded to the fixed width, launches
  // sized for max_model_len (so the launch sequence does not depend on the contexts).
  StepMetadata bucket_metadata(const std::vector<SeqRows>& seqs, int T) const {
    StepMetadata m = build_step_metadata(seqs, spec_.index_block, opt_.num_cache_blocks, T);
    widen_block_tables(m, fw_.table_width());
    return m;
  }

  // A bucket step (native/bucket_rows.h): n request rows of q tokens padded to B rows, T = B q.
  void run_decode(const StepBatch& batch, const std::vector<CheckedSeq>& seqs, int q, float* logits, int path,
                  LayerRangeRunner* runner, StepOutput& out) {
    const int n = int(batch.seqs.size());
    ++stats_.bucket_steps;
    const int T = decode_bucket(n) * q;
    std::vector<SeqRows> rows;
    for (const CheckedSeq& s : seqs) rows.push_back(rows_of(s));
    const StepMetadata m = bucket_metadata(rows, T);
    std::vector<int32_t> ids(size_t(T), 0);  // padding rows embed token 0 (never written, logits dropped)
    for (int i = 0; i < n; ++i) std::copy_n(batch.seqs[size_t(i)].tokens.begin(), q, ids.begin() + ptrdiff_t(i) * q);
    fw_.upload(m, ids, stream_);
    const LayerPlan& plan = fw_.bucket_plan(T);
    Activations& act = fw_.act();
    GraphCache::Result r;
    if (aux_layers_.empty()) {
      r = graphs_.run({T, path, 0}, stream_, [&] { fw_.run(plan, stream_, nullptr, runner); });
    } else {
      std::vector<int> cuts;
      M3_CHECK(aux_runner_cuts(plan, aux_layers_, fw_.model().sparse_range(), &cuts) || !runner,
               "cuda backend: aux layers {} include one whose hidden state the {} path cannot leave between its parts",
               fmt::join(aux_layers_, ","), runner ? runner->name() : "");
      AuxCapture cap(plan, aux_layers_, act.x.get<float>(), spec_.hidden, T, aux_dev_.get<float>(), nullptr);
      r = graphs_.run({T, path, aux_variant_}, stream_, [&] {
        fw_.run(plan, stream_, &cap, runner, runner ? std::span<const int>(cuts) : std::span<const int>());
      });
      for (int i = 0; i < n; ++i)  // request row i: bucket rows i q .. i q + q - 1
        if (batch.seqs[size_t(i)].want_aux) aux_to_host(out, i * q, q, out.aux_first_row[size_t(i)]);
    }
    if (r.replayed) ++stats_.graph_replays;
    if (r.captured) ++stats_.graph_captures;
    const size_t V = size_t(spec_.vocab_size);
    for (const BucketRun& run : bucket_output_runs(batch, q)) {
      const float* src = act.logits.get<float>() + size_t(run.bucket_row) * V;
      samples_.launch_rows(src, run.out_row, run.count, stream_);  // eagerly, after the replay (outside the graph)
      if (logits)
        M3_CUDA_CHECK(cudaMemcpyAsync(logits + size_t(run.out_row) * V, src, size_t(run.count) * V * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  int device_ = -1;
  ModelSpec spec_;       // the model's
  ModelSpec rank_spec_;  // this rank's shapes (the model's at one rank)
  CudaBackendOptions opt_;
  std::unique_ptr<DeviceKvCache> own_cache_;  // null when the cache is borrowed
  DeviceKvCache* cache_ = nullptr;
  Forward fw_;
  WrittenSlots written_;
  StepSamples samples_;
  cudaStream_t stream_ = nullptr;
  Dispatcher dispatcher_;
  std::map<std::string, std::unique_ptr<LayerRangeRunner>> runners_;
  GraphCache graphs_;
  CudaBackendStats stats_;
  BlockScoreTrace* score_trace_ = nullptr;
  bool tracing_ = false;  // the step being chosen has a SelectionTrace
  std::vector<int> aux_layers_;                  // this step's StepBatch::aux_layers
  DevBuf aux_dev_;                               // [max_tokens][aux width] rows the plans copy out
  std::vector<std::vector<int>> aux_variants_;   // aux layer lists seen: graph variant = index + 1
  int aux_variant_ = 0;
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const PreparedWeights> weights,
                                               const CudaBackendOptions& opt) {
  return std::make_unique<CudaBackendImpl>(std::move(weights), opt);
}

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const PreparedWeights> weights,
                                               const CudaBackendOptions& opt, DeviceKvCache* borrowed_cache) {
  M3_CHECK(borrowed_cache != nullptr, "cuda backend: no cache to borrow");
  return std::make_unique<CudaBackendImpl>(std::move(weights), opt, borrowed_cache);
}

bool cuda_device_available() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace m3::native
