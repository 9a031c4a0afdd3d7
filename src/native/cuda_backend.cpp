// CudaBackend (native/cuda_backend.h): step validation, chunking into passes of at most
// max_tokens rows, the per-pass forward (one launcher per op), the padded decode buckets and
// their CUDA graphs, logits back to the host.
#include "native/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/codecs.h"
#include "native/attention.h"
#include "native/cuda_backend_ops.h"
#include "native/cuda_check.h"
#include "native/embed.h"
#include "native/indexer.h"
#include "native/kv_cache.h"
#include "native/linear.h"
#include "native/moe.h"
#include "native/norm.h"
#include "native/prepared.h"
#include "native/qk_norm_rope.h"
#include "native/sampling.h"
#include "native/step_metadata.h"
#include "runtime/step_sampling.h"

namespace m3::native {

namespace {

constexpr int kMaxBuckets = 16;  // bucket i holds 2^i rows

int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

// One device allocation, freed on destruction.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    if (bytes) M3_CUDA_CHECK(cudaMalloc(&p_, bytes));
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A pass: rows of several sequences, each with its new tokens, plus which rows return logits.
struct Pass {
  std::vector<SeqRows> seqs;
  std::vector<int32_t> ids;       // [rows] token ids
  std::vector<int32_t> out_rows;  // rows (in pass order) that return logits, in output order
};

// Per-pass trace sinks (eager passes only).
struct PassTrace {
  SelectionTrace* sel = nullptr;
  BlockScoreTrace* scores = nullptr;
};

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(std::shared_ptr<const PreparedWeights> w, const CudaBackendOptions& opt,
                  DeviceKvCache* borrowed_cache = nullptr)
      : w_(std::move(w)), opt_(opt) {
    M3_CHECK(w_ != nullptr, "cuda backend: no prepared weights");
    if (borrowed_cache) opt_.num_cache_blocks = borrowed_cache->shape().num_blocks;
    if (opt_.device >= 0) M3_CUDA_CHECK(cudaSetDevice(opt_.device));
    spec_ = w_->spec();
    const PreparedLayout& L = w_->layout();
    M3_CHECK(L.opt.tp_size == 1, "cuda backend: prepared weights are rank {} of {}; this backend runs one rank of 1",
             L.opt.tp_rank, L.opt.tp_size);
    const int bs = spec_.index_block;
    M3_CHECK(opt_.num_cache_blocks > 0, "cuda backend: num_cache_blocks must be > 0, got {}", opt_.num_cache_blocks);
    M3_CHECK(opt_.max_tokens > 0, "cuda backend: max_tokens must be > 0, got {}", opt_.max_tokens);
    M3_CHECK(opt_.logits_rows > 0, "cuda backend: logits_rows must be > 0, got {}", opt_.logits_rows);
    M3_CHECK(opt_.max_graph_batch >= 1 && (opt_.max_graph_batch & (opt_.max_graph_batch - 1)) == 0 &&
                 opt_.max_graph_batch <= opt_.max_tokens && opt_.max_graph_batch < (1 << kMaxBuckets),
             "cuda backend: max_graph_batch {} must be a power of two <= max_tokens {}", opt_.max_graph_batch,
             opt_.max_tokens);
    int64_t cap = int64_t(opt_.num_cache_blocks) * bs;
    if (spec_.max_positions > 0) cap = std::min<int64_t>(cap, spec_.max_positions);
    if (opt_.max_model_len <= 0) opt_.max_model_len = int(std::min<int64_t>(cap, INT32_MAX));
    M3_CHECK(opt_.max_model_len <= cap, "cuda backend: max_model_len {} exceeds what the cache / model allow ({})",
             opt_.max_model_len, cap);
    M3_CHECK(spec_.hidden % 4 == 0 && spec_.q_dim() % 4 == 0,
             "cuda backend: hidden {} and q_dim {} must be multiples of 4 (16-byte activation rows)", spec_.hidden,
             spec_.q_dim());
    logits_rows_ = std::max(opt_.logits_rows, opt_.max_graph_batch);
    path_ = LinearPath::Auto;  // tensor-core linears for every M (fp32_activations: no effect)
    table_width_ = (opt_.max_model_len + bs - 1) / bs;

    M3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    int dev = 0;
    M3_CUDA_CHECK(cudaGetDevice(&dev));
    M3_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));

    KvCacheShape shape = kv_cache_shape(spec_, opt_.num_cache_blocks, opt_.kv_dtype, opt_.ik_dtype);
    if (borrowed_cache) {
      const KvCacheShape& b = borrowed_cache->shape();
      M3_CHECK(b.num_layers == shape.num_layers && b.block_size == shape.block_size && b.kv_heads == shape.kv_heads &&
                   b.head_dim == shape.head_dim && b.index_dim == shape.index_dim && b.kv_dtype == shape.kv_dtype &&
                   b.ik_dtype == shape.ik_dtype && b.has_index == shape.has_index,
               "cuda backend: the borrowed cache's shape does not match the model's ({} layers, block {}, {} KV heads "
               "x {}, index dim {}, {} / {})",
               shape.num_layers, shape.block_size, shape.kv_heads, shape.head_dim, shape.index_dim,
               dtype_name(shape.kv_dtype), dtype_name(shape.ik_dtype));
      cache_ = borrowed_cache;
    } else {
      own_cache_ = std::make_unique<DeviceKvCache>(shape);
      cache_ = own_cache_.get();
    }
    for (int l = 0; l < spec_.num_layers; ++l)
      cache_->set_scales(l, opt_.k_scale, opt_.v_scale, spec_.sparse(l) ? opt_.ik_scale : 1.0f);
    rope_ = std::make_unique<DeviceRope>(spec_.rotary_dim, spec_.rope_theta);
    meta_ = std::make_unique<DeviceStepMetadata>(opt_.max_tokens, opt_.max_tokens, table_width_);
    lin_eager_ = std::make_unique<LinearContext>();
    lin_decode_ = std::make_unique<LinearContext>();
    written_.assign(size_t(shape.num_slots()), -1);

    allocate_buffers();
    load_norms();
    for (int l = 0; l < spec_.num_layers; ++l) {
      qkv_.push_back(w_->qkv(l));
      o_w_.push_back(w_->o(l));
      norms_.push_back(w_->norms(l));
      if (spec_.moe(l)) moe_w_.push_back(w_->moe(l));
      else moe_w_.emplace_back();
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (opt_.cuda_graphs) warm_up_decode();
  }

  ~CudaBackendImpl() override {
    for (auto& g : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (cudaEvent_t e : {fork_ev_, join_ev_})
      if (e) cudaEventDestroy(e);
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  std::string name() const override { return "cuda-native"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return spec_.index_block; }
  int num_cache_blocks() const override { return opt_.num_cache_blocks; }
  DeviceKvCache& kv_cache() override { return *cache_; }
  const CudaBackendOptions& options() const override { return opt_; }
  CudaBackendStats stats() const override { return stats_; }
  void set_block_score_trace(BlockScoreTrace* s) override { score_trace_ = s; }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    prepared_bucket_ = 0;  // the step overwrites the metadata prepare_decode uploaded
    std::vector<SeqRows> seqs = validate(batch);
    validate_sampling_requests(batch);
    ++stats_.steps;
    StepOutput out;
    out.vocab = spec_.vocab_size;
    int rows = 0;
    sample_jobs_.clear();
    bool copy_logits = false;  // skipped when every sequence samples here and none wants logits
    for (const SeqStep& s : batch.seqs) {
      out.first_row.push_back(rows);
      const int n = s.all_logits ? int(s.tokens.size()) : 1;
      out.num_rows.push_back(n);
      rows += n;
      copy_logits = copy_logits || s.want_logits || !s.sample;
      if (s.sample) {
        kernels::SampleJob j;
        j.row = rows - 1;  // global output row until launched (then the row in logits_)
        j.temperature = s.sample->params.temperature;
        j.top_k = s.sample->params.top_k;
        j.top_p = s.sample->params.top_p;
        j.seed = s.sample->state.seed;
        j.draw = s.sample->state.draws;
        sample_jobs_.push_back(j);
      }
    }
    if (!sample_jobs_.empty()) prepare_sampling();
    if (copy_logits) out.logits.resize(size_t(rows) * size_t(spec_.vocab_size));
    float* host_logits = copy_logits ? out.logits.data() : nullptr;

    bool decode = !trace && int(batch.seqs.size()) <= opt_.max_graph_batch;
    for (const SeqStep& s : batch.seqs) decode = decode && s.tokens.size() == 1;
    if (decode) {
      run_decode(batch, seqs, host_logits);
    } else {
      PassTrace pt{trace, trace ? score_trace_ : nullptr};
      if (trace) {
        trace->clear();
        for (int l = 0; l < spec_.num_layers; ++l) {
          if (spec_.sparse(l)) trace->layers.push_back(l);
          if (spec_.moe(l)) trace->moe_layers.push_back(l);
        }
        trace->blocks.resize(trace->layers.size());
        trace->experts.resize(trace->moe_layers.size());
        if (trace->record_cache) {
          trace->cache_k.resize(size_t(spec_.num_layers));
          trace->cache_v.resize(size_t(spec_.num_layers));
          trace->cache_ik.resize(size_t(spec_.num_layers));
        }
        if (pt.scores) {
          pt.scores->layers = trace->layers;
          pt.scores->scores.assign(trace->layers.size(), {});
        }
      }
      run_chunked(batch, seqs, host_logits, pt);
    }
    if (!sample_jobs_.empty()) out.tokens = collect_samples(batch);
    // Only now (every launch succeeded) do the new positions count as written.
    for (const SeqRows& s : seqs)
      for (int j = 0; j < s.num_new; ++j) {
        const int32_t pos = s.start_pos + j;
        written_[size_t(slot_of(s.block_table, pos))] = pos;
      }
    return out;
  }

  // ---- benchmark hooks (cuda_backend.h) ----

  void assume_cache_filled(std::span<const int32_t> table, int64_t length) override {
    const int bs = spec_.index_block;
    M3_CHECK(length >= 0 && length <= opt_.max_model_len, "assume_cache_filled: length {} outside [0, {}]", length,
             opt_.max_model_len);
    M3_CHECK(int64_t(table.size()) * bs >= length, "assume_cache_filled: {} positions need {} blocks of {}, the table has {}",
             length, (length + bs - 1) / bs, bs, table.size());
    for (int64_t b = 0; b * bs < length; ++b)
      M3_CHECK(table[size_t(b)] >= 0 && table[size_t(b)] < opt_.num_cache_blocks,
               "assume_cache_filled: block_table[{}] = {} is outside [0, {})", b, table[size_t(b)], opt_.num_cache_blocks);
    for (int64_t p = 0; p < length; ++p) written_[size_t(slot_of(table, p))] = int32_t(p);
  }

  int prepare_decode(const StepBatch& batch) override {
    M3_CHECK(!batch.seqs.empty() && int(batch.seqs.size()) <= opt_.max_graph_batch,
             "prepare_decode: {} sequences (a decode bucket holds 1 .. {})", batch.seqs.size(), opt_.max_graph_batch);
    for (size_t i = 0; i < batch.seqs.size(); ++i)
      M3_CHECK(batch.seqs[i].tokens.size() == 1, "prepare_decode: sequence {} has {} new tokens (decode: 1)", i,
               batch.seqs[i].tokens.size());
    prepared_bucket_ = 0;
    const std::vector<SeqRows> seqs = validate(batch);
    const int B = upload_decode(batch, seqs);
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    prepared_bucket_ = B;
    return B;
  }

  void enqueue_decode(cudaStream_t s, StepObserver* obs) override {
    M3_CHECK(prepared_bucket_ > 0, "enqueue_decode: no decode batch prepared (prepare_decode) since the last step");
    fork_from(s);
    obs_ = obs;
    try {
      bucket_launches(prepared_bucket_);
    } catch (...) {
      obs_ = nullptr;
      throw;
    }
    obs_ = nullptr;
    join_into(s);
  }

  const float* device_logits() const override { return logits_.get<float>(); }

  StepOutput step_observed(const StepBatch& batch, cudaStream_t s, StepObserver* obs) override {
    fork_from(s);
    obs_ = obs;
    StepOutput out;
    try {
      out = step(batch, nullptr);
    } catch (...) {
      obs_ = nullptr;
      throw;
    }
    obs_ = nullptr;
    join_into(s);
    return out;
  }

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::array<void*, 4> scratch{};  // lin_decode_ buffers the graph was captured with
  };

  // Observer hook (benchmarks): before the launches of op `op` of layer `layer` (-1: none).
  void mark(const char* op, int layer) {
    if (obs_) obs_->before_op(stream_, op, layer);
  }
  // Orders the backend's stream after the work on s (fork_from) / s after the backend's (join_into).
  void fork_from(cudaStream_t s) {
    if (!fork_ev_) M3_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    if (!join_ev_) M3_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    if (s == stream_) return;
    M3_CUDA_CHECK(cudaEventRecord(fork_ev_, s));
    M3_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_ev_, 0));
  }
  void join_into(cudaStream_t s) {
    if (s == stream_) return;
    M3_CUDA_CHECK(cudaEventRecord(join_ev_, stream_));
    M3_CUDA_CHECK(cudaStreamWaitEvent(s, join_ev_, 0));
  }

  int64_t slot_of(std::span<const int32_t> table, int64_t pos) const {
    const int bs = spec_.index_block;
    return int64_t(table[size_t(pos / bs)]) * bs + pos % bs;
  }

  // Every check of the reference's plan_step that matters for the device: token ids, positions,
  // tables, history written by earlier steps, no new token overwriting what another sequence of the
  // step reads. Nothing is launched before all of them pass. Returns the rows with each table cut
  // to the blocks its positions need.
  std::vector<SeqRows> validate(const StepBatch& batch) const {
    M3_CHECK(!batch.seqs.empty(), "step: the batch has no sequences");
    const int bs = spec_.index_block;
    std::vector<SeqRows> seqs(batch.seqs.size());
    std::unordered_map<int32_t, std::vector<std::pair<int, int>>> reads;  // phys block -> (seq, logical block)
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqStep& q = batch.seqs[i];
      const int64_t n = int64_t(q.tokens.size());
      M3_CHECK(n >= 1, "step: sequence {} has no tokens", i);
      M3_CHECK(q.start_pos >= 0, "step: sequence {} has start_pos {} < 0", i, q.start_pos);
      const int64_t end = int64_t(q.start_pos) + n;
      M3_CHECK(end <= opt_.max_model_len,
               "step: sequence {} reaches position {} but this backend holds at most {} positions (max_model_len)", i,
               end - 1, opt_.max_model_len);
      const int64_t need = (end + bs - 1) / bs;
      M3_CHECK(int64_t(q.block_table.size()) >= need,
               "step: sequence {} covers positions [0, {}) which need {} blocks of {}, its block table has {}", i, end,
               need, bs, q.block_table.size());
      for (int64_t b = 0; b < need; ++b) {
        const int32_t id = q.block_table[size_t(b)];
        M3_CHECK(id >= 0 && id < opt_.num_cache_blocks, "step: sequence {} block_table[{}] = {} is outside [0, {})", i,
                 b, id, opt_.num_cache_blocks);
      }
      for (int64_t t = 0; t < n; ++t) {
        const int32_t id = q.tokens[size_t(t)];
        M3_CHECK(id >= 0 && id < spec_.vocab_size, "step: sequence {} token {} has id {} outside the vocabulary [0, {})",
                 i, t, id, spec_.vocab_size);
      }
      std::span<const int32_t> table(q.block_table.data(), size_t(need));
      // History: the first and the last position of every block below start_pos must hold what
      // this table says (O(blocks), not O(positions)).
      for (int64_t b = 0; b * bs < q.start_pos; ++b) {
        for (int64_t p : {b * bs, std::min<int64_t>(q.start_pos, (b + 1) * bs) - 1}) {
          const int32_t wpos = written_[size_t(slot_of(table, p))];
          M3_CHECK(wpos == p,
                   "step: sequence {} position {} maps to cache slot {} (block {}), which holds {}; the block table "
                   "does not match what earlier steps wrote",
                   i, p, slot_of(table, p), table[size_t(b)],
                   wpos < 0 ? std::string("nothing") : "position " + std::to_string(wpos));
        }
        reads[table[size_t(b)]].emplace_back(int(i), int(b));
      }
      seqs[i] = SeqRows{q.start_pos, int32_t(n), table};
    }
    // A new token must not overwrite history that another sequence of the step reads.
    for (size_t i = 0; i < seqs.size(); ++i)
      for (int j = 0; j < seqs[i].num_new; ++j) {
        const int64_t pos = seqs[i].start_pos + j;
        const int32_t blk = seqs[i].block_table[size_t(pos / bs)];
        auto it = reads.find(blk);
        if (it == reads.end()) continue;
        for (auto [s, b] : it->second) {
          const int64_t read_pos = int64_t(b) * bs + pos % bs;
          M3_CHECK(read_pos >= seqs[size_t(s)].start_pos || (size_t(s) == i && read_pos == pos),
                   "step: sequence {} position {} writes cache slot {}, which holds position {} of sequence {}", i,
                   pos, slot_of(seqs[i].block_table, pos), read_pos, s);
        }
      }
    return seqs;
  }

  // ---- buffers ----

  void allocate_buffers() {
    const ModelSpec& s = spec_;
    const int64_t T = opt_.max_tokens, H = s.hidden;
    int64_t width = 0;
    for (int l = 0; l < s.num_layers; ++l) width = std::max(width, qk_norm_rope_args(s, l).proj_stride);
    proj_ld_ = round4(width);
    const int64_t iqd = int64_t(s.index_heads) * s.index_dim;
    x_ = DevBuf(size_t(T * H) * 4);
    f_ = DevBuf(size_t(T * H) * 4);
    a_ = DevBuf(size_t(T * H) * 4);
    proj_ = DevBuf(size_t(T * proj_ld_) * 4);
    q_ = DevBuf(size_t(T * s.q_dim()) * 4);
    o_ = DevBuf(size_t(T * s.q_dim()) * 4);
    iq_ = DevBuf(size_t(std::max<int64_t>(T * iqd, 4)) * 4);
    ids_ = DevBuf(size_t(T) * 4);
    rows_ = DevBuf(size_t(T) * 4);
    gather_ = DevBuf(size_t(std::min<int64_t>(T, logits_rows_) * H) * 4);
    logits_ = DevBuf(size_t(logits_rows_) * size_t(s.vocab_size) * 4);
    ld_h_ = round4(std::max(s.dense_inter, 1));
    bool dense = false;
    size_t moe_ws = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      if (s.moe(l)) moe_ws = std::max(moe_ws, moe_workspace_bytes(w_->moe(l), int(T)));
      else dense = true;
    }
    if (dense) h_ = DevBuf(size_t(T * ld_h_) * 4);
    if (moe_ws) moe_ws_ = DevBuf(moe_ws);
    if (s.num_sparse_layers() > 0) {
      idx_ws_ = DevBuf(indexer_workspace_bytes(int(T), s.index_heads, opt_.max_model_len, s.index_block));
      sel_ = DevBuf(size_t(T) * size_t(s.num_kv_heads) * size_t(s.index_topk) * 4);
    }
    // Attention chunk sizes: fixed per backend from max_model_len (at most kMaxAttnChunks chunks per
    // row), so a row's attention bits never depend on the batch (kernels/attention.cuh).
    for (bool sparse : {false, true}) {
      const int tiles = attention_max_tiles(sparse, s.index_topk, s.index_block, opt_.max_model_len);
      tiles_per_chunk_[sparse] = std::max(kDefaultTilesPerChunk, (tiles + kMaxAttnChunks - 1) / kMaxAttnChunks);
    }
    // Workspace of the multi-block mode: the most any pass of <= T rows can ask for, up to a cap;
    // a pass that would need more runs one block per (token, KV group) instead (same bits).
    size_t aws = 0;
    for (int t = 1; t <= T; ++t)
      for (bool sparse : {false, true}) {
        if (sparse && s.num_sparse_layers() == 0) continue;
        const int C = chunks(sparse, opt_.max_model_len);
        if (attention_splits(t, s.num_kv_heads, C, sms_) <= 1) continue;
        const size_t need = attention_workspace_bytes(t, s.num_heads, s.num_kv_heads, s.head_dim, C);
        if (need <= kMaxAttnWorkspace) aws = std::max(aws, need);
      }
    attn_ws_ = DevBuf(std::max<size_t>(aws, 16));
  }

  // q/k (and index q/k) norm weights as fp32 device vectors (the rope kernel reads fp32; the
  // conversion from the arena's bf16 is exact).
  void load_norms() {
    const PreparedLayout& L = w_->layout();
    auto reader = w_->reader();
    std::vector<float> host;
    std::vector<std::array<int64_t, 4>> at(size_t(spec_.num_layers));
    auto add = [&](const PTensor& t) -> int64_t {
      if (t.empty()) return -1;
      std::vector<uint16_t> b(size_t(t.cols));
      reader(t.offset, uint64_t(t.cols) * 2, b.data());
      const int64_t off = int64_t(host.size());
      for (uint16_t v : b) host.push_back(bf16_to_f32(v));
      host.resize(size_t(round4(int64_t(host.size()))), 0.f);
      return off;
    };
    for (int l = 0; l < spec_.num_layers; ++l) {
      const auto& Y = L.layers[size_t(l)];
      at[size_t(l)] = {add(Y.q_norm), add(Y.k_norm), add(Y.iq_norm), add(Y.ik_norm)};
    }
    norm_f32_ = DevBuf(std::max<size_t>(host.size(), 4) * 4);
    M3_CUDA_CHECK(cudaMemcpy(norm_f32_.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    for (int l = 0; l < spec_.num_layers; ++l) {
      std::array<const float*, 4> p{};
      for (int k = 0; k < 4; ++k) p[size_t(k)] = at[size_t(l)][size_t(k)] < 0 ? nullptr : norm_f32_.get<float>() + at[size_t(l)][size_t(k)];
      qk_norms_.push_back(p);
    }
  }

  // Chunks of the longest key list at context ctx, and the attention's blocks per (token, KV group)
  // at T rows: 1 when the workspace cannot hold the multi-block mode's chunk states.
  int chunks(bool sparse, int ctx) const {
    const int tiles = attention_max_tiles(sparse, spec_.index_topk, spec_.index_block, std::max(ctx, 1));
    return attention_chunks(tiles, tiles_per_chunk_[sparse]);
  }
  int splits(bool sparse, int T, int ctx) const {
    const int C = chunks(sparse, ctx);
    const int S = attention_splits(T, spec_.num_kv_heads, C, sms_);
    if (S > 1 && attention_workspace_bytes(T, spec_.num_heads, spec_.num_kv_heads, spec_.head_dim, C) > attn_ws_.bytes())
      return 1;
    return S;
  }

  // ---- the forward ----

  // The residual stream x_ (T rows of hidden fp32): with add_f, x_ += f_ (the last sublayer's
  // output) first; then a_ = RMSNorm(x_) * (1 + w), the next sublayer's input.
  void residual_norm(const uint16_t* w, int T, bool add_f, cudaStream_t st) {
    const int H = spec_.hidden;
    RmsNormArgs n;
    n.n = H;
    n.M = T;
    n.eps = spec_.rms_eps;
    n.w = w;
    n.y = a_.get<float>();
    n.ld_y = H;
    n.x = (add_f ? f_ : x_).get<float>();
    n.ld_x = H;
    if (add_f) {
      n.residual = x_.get<float>();
      n.ld_res = H;
      n.residual_out = x_.get<float>();
      n.ld_res_out = H;
    }
    rms_norm(n, st);
  }

  // Runs every layer and the final norm over T rows of the uploaded metadata; leaves the normed
  // final hidden states in a_. ctx: the context bound launches are sized for.
  void forward_layers(int T, const StepMetadataView& mv, int ctx, LinearContext& lin, const PassTrace* tr,
                      int live_rows, const std::vector<int32_t>* positions) {
    const ModelSpec& s = spec_;
    const int H = s.hidden;
    const cudaStream_t st = stream_;
    const DenseWeight E = w_->embed();
    EmbedArgs ea;
    ea.table = static_cast<const uint16_t*>(E.data);
    ea.ld = E.ld / 2;
    ea.V = E.rows;
    ea.H = H;
    ea.M = T;
    ea.ids = ids_.get<int32_t>();
    ea.out = x_.get<float>();
    ea.ld_out = H;
    mark("embed", -1);
    embed(ea, st);
    const int S_dense = splits(false, T, ctx), S_sparse = splits(true, T, ctx);
    int sparse_k = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      const LayerNormWeights& nw = norms_[size_t(l)];
      mark("norms", l);
      residual_norm(nw.input, T, /*add_f=*/l > 0, st);
      mark("qkv", l);
      linear_fp8(qkv_[size_t(l)], ActIn{a_.get(), DType::F32, H}, T, proj_.get<float>(), proj_ld_, st, &lin, path_);

      QkNormRopeArgs qa = qk_norm_rope_args(s, l);
      qa.proj = proj_.get<float>();
      qa.proj_stride = proj_ld_;
      qa.q_norm = qk_norms_[size_t(l)][0];
      qa.k_norm = qk_norms_[size_t(l)][1];
      qa.iq_norm = qk_norms_[size_t(l)][2];
      qa.ik_norm = qk_norms_[size_t(l)][3];
      qa.inv_freq = rope_->inv_freq();
      qa.q_out = q_.get<float>();
      qa.iq_out = iq_.get<float>();
      const KvLayerView cv = cache_->layer(l);
      mark("rope_cache", l);
      qk_norm_rope_cache(qa, mv, cv, st);
      if (tr && tr->sel && tr->sel->record_cache) record_cache_rows(*tr, l, live_rows, cv);

      const int32_t* sel = nullptr;
      if (s.sparse(l)) {
        IndexerArgs ia;
        ia.iq = iq_.get<float>();
        ia.index_heads = s.index_heads;
        ia.index_dim = s.index_dim;
        ia.topk = s.index_topk;
        ia.local = s.index_local;
        ia.workspace = idx_ws_.get();
        ia.workspace_bytes = idx_ws_.bytes();
        ia.selected = sel_.get<int32_t>();
        mark("index_k", l);
        indexer_select(ia, mv, cv, st);
        sel = sel_.get<int32_t>();
        if (tr && tr->sel) record_trace(*tr, sparse_k, T, live_rows, mv, *positions);
        ++sparse_k;
      }
      AttentionArgs aa;
      aa.q = q_.get<float>();
      aa.num_heads = s.num_heads;
      aa.selected = sel;
      aa.topk = sel ? s.index_topk : 0;
      aa.num_splits = sel ? S_sparse : S_dense;
      aa.tiles_per_chunk = tiles_per_chunk_[sel != nullptr];
      aa.workspace = attn_ws_.get();
      aa.workspace_bytes = attn_ws_.bytes();
      aa.out = o_.get<float>();
      mark("kv", l);
      attention_forward(aa, mv, cv, st);
      mark("o", l);
      linear_fp8(o_w_[size_t(l)], ActIn{o_.get(), DType::F32, s.q_dim()}, T, f_.get<float>(), H, st, &lin, path_);

      mark("norms", l);
      residual_norm(nw.post, T, /*add_f=*/true, st);
      if (s.moe(l)) {
        mark("moe", l);
        moe_forward(moe_w_[size_t(l)], a_.get<float>(), H, T, f_.get<float>(), H, moe_ws_.get(), moe_ws_.bytes(), st);
        if (tr && tr->sel) record_experts(*tr, l, T, live_rows, moe_w_[size_t(l)]);
        if (obs_) obs_->after_moe(st, l, moe_workspace(moe_w_[size_t(l)], T, moe_ws_.get()).ids, T, s.top_k);
      } else {
        mark("dense_mlp", l);
        dense_mlp(w_->dense_gate_up(l), w_->dense_down(l), ActIn{a_.get(), DType::F32, H}, T, s.swiglu_alpha,
                  s.swiglu_limit, h_.get<float>(), ld_h_, f_.get<float>(), H, st, &lin, path_);
      }
    }
    mark("lm_head", -1);
    residual_norm(w_->final_norm(), T, /*add_f=*/true, st);
  }

  // Appends what the live rows' K, V (and index-K) entries of layer l read back as (decoded, times
  // the scale) to the trace: one copy per run of consecutive slots (synchronizes: eager passes only).
  void record_cache_rows(const PassTrace& tr, int l, int live, const KvLayerView& cv) {
    const std::vector<int32_t>& slots = *pass_slots_;
    auto copy = [&](const void* cache, DType dt, int width, float scale, std::vector<float>& dst) {
      const size_t eb = dtype_size(dt), row = size_t(width) * eb;
      std::vector<uint8_t> raw(size_t(live) * row);
      for (int t = 0; t < live;) {
        int e = t + 1;
        while (e < live && slots[size_t(e)] == slots[size_t(e - 1)] + 1) ++e;
        M3_CUDA_CHECK(cudaMemcpyAsync(raw.data() + size_t(t) * row, static_cast<const uint8_t*>(cache) + size_t(slots[size_t(t)]) * row,
                                      size_t(e - t) * row, cudaMemcpyDeviceToHost, stream_));
        t = e;
      }
      M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < size_t(live) * size_t(width); ++i)
        dst.push_back(dt == DType::F8_E4M3 ? e4m3_to_f32(raw[i]) * scale
                                            : bf16_to_f32(reinterpret_cast<const uint16_t*>(raw.data())[i]));
    };
    copy(cv.k, cv.kv_dtype, spec_.kv_dim(), cv.k_scale, tr.sel->cache_k[size_t(l)]);
    copy(cv.v, cv.kv_dtype, spec_.kv_dim(), cv.v_scale, tr.sel->cache_v[size_t(l)]);
    if (cv.ik) copy(cv.ik, cv.ik_dtype, spec_.index_dim, cv.ik_scale, tr.sel->cache_ik[size_t(l)]);
  }

  // Copies the router's top-k (best first) of MoE layer l for the live rows of this pass into the
  // trace (synchronizes the stream: eager passes only).
  void record_experts(const PassTrace& tr, int l, int T, int live, const MoeWeights& w) {
    const int K = spec_.top_k;
    const auto& ml = tr.sel->moe_layers;
    const size_t k = size_t(std::find(ml.begin(), ml.end(), l) - ml.begin());
    std::vector<int32_t> ids(size_t(T) * K);
    M3_CUDA_CHECK(cudaMemcpyAsync(ids.data(), moe_workspace(w, T, moe_ws_.get()).ids, ids.size() * 4,
                                  cudaMemcpyDeviceToHost, stream_));
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto& dst = tr.sel->experts[k];
    for (int t = 0; t < live; ++t) dst.emplace_back(ids.begin() + ptrdiff_t(t) * K, ids.begin() + ptrdiff_t(t + 1) * K);
  }

  // Copies the selected blocks (and, when asked, the block scores) of sparse layer k for the live
  // rows of this pass into the trace (synchronizes the stream: eager passes only).
  void record_trace(const PassTrace& tr, int k, int T, int live, const StepMetadataView& mv,
                    const std::vector<int32_t>& positions) {
    const int G = spec_.index_heads, K = spec_.index_topk, bs = spec_.index_block;
    std::vector<int32_t> sel(size_t(T) * G * K);
    M3_CUDA_CHECK(cudaMemcpyAsync(sel.data(), sel_.get(), sel.size() * 4, cudaMemcpyDeviceToHost, stream_));
    const int mqb = (mv.max_context + bs - 1) / bs;
    std::vector<float> sc;
    if (tr.scores) {
      sc.resize(size_t(T) * G * size_t(mqb));
      M3_CUDA_CHECK(cudaMemcpyAsync(sc.data(), idx_ws_.get(), sc.size() * 4, cudaMemcpyDeviceToHost, stream_));
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto& dst = tr.sel->blocks[size_t(k)];
    for (int t = 0; t < live; ++t) {
      auto& row = dst.emplace_back(size_t(G));
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < K; ++j) {
          const int32_t b = sel[(size_t(t) * G + g) * K + j];
          if (b >= 0) row[size_t(g)].push_back(b);
        }
      if (tr.scores) {
        auto& srow = tr.scores->scores[size_t(k)].emplace_back(size_t(G));
        const int nb = positions[size_t(t)] / bs + 1;
        for (int g = 0; g < G; ++g) {
          const float* b = sc.data() + (size_t(t) * G + g) * size_t(mqb);
          srow[size_t(g)].assign(b, b + nb);
        }
      }
    }
  }

  // lm_head over R rows of src (fp32 [R][H]) into logits rows (the step's output rows g0 ..
  // g0 + R - 1), sampling the requested ones there; then to the host unless host is null.
  void lm_head_to_host(const float* src, int R, LinearContext& lin, float* host, int g0) {
    const DenseWeight lm = w_->lm_head();
    const int V = spec_.vocab_size;
    for (int r0 = 0; r0 < R; r0 += logits_rows_) {
      const int r = std::min(logits_rows_, R - r0);
      linear_dense(lm, ActIn{src + size_t(r0) * spec_.hidden, DType::F32, spec_.hidden}, r, logits_.get<float>(), V,
                   stream_, &lin, path_);
      sample_rows(g0 + r0, r);
      if (host)
        M3_CUDA_CHECK(cudaMemcpyAsync(host + size_t(r0) * V, logits_.get(), size_t(r) * V * 4, cudaMemcpyDeviceToHost,
                                      stream_));
    }
  }

  // ---- sampling on the device (SeqStep::sample; native/sampling.h) ----

  // The sampler (lazily: 32 stochastic rows per sort group) and the token / status buffers.
  void prepare_sampling() {
    if (!sampler_) sampler_ = std::make_unique<DeviceSampler>(32, spec_.vocab_size);
    const size_t need = sample_jobs_.size() * 4;
    if (sample_tokens_.bytes() < need) {
      sample_tokens_ = DevBuf(std::max<size_t>(need, 256));
      sample_status_ = DevBuf(std::max<size_t>(need, 256));
    }
  }

  // Launches the jobs whose output row lies in [g0, g0 + r) over logits_ (row g - g0). Jobs are in
  // output-row order, so they are one contiguous run.
  void sample_rows(int g0, int r) {
    size_t b = 0;
    while (b < sample_jobs_.size() && sample_jobs_[b].row < g0) ++b;
    size_t e = b;
    while (e < sample_jobs_.size() && sample_jobs_[e].row < g0 + r) ++e;
    if (b == e) return;
    std::vector<kernels::SampleJob> run(sample_jobs_.begin() + ptrdiff_t(b), sample_jobs_.begin() + ptrdiff_t(e));
    for (auto& j : run) j.row -= g0;
    sampler_->sample(logits_.get<float>(), spec_.vocab_size, run, sample_tokens_.get<int32_t>() + b,
                     sample_status_.get<int32_t>() + b, stream_);
  }

  // After the step's launches: the tokens per sequence (-1 where none was requested); throws for
  // a row with NaN logits (or all -inf, stochastic), naming the sequence.
  std::vector<int32_t> collect_samples(const StepBatch& batch) {
    const size_t J = sample_jobs_.size();
    std::vector<int32_t> tok(J), st(J);
    M3_CUDA_CHECK(cudaMemcpyAsync(tok.data(), sample_tokens_.get(), J * 4, cudaMemcpyDeviceToHost, stream_));
    M3_CUDA_CHECK(cudaMemcpyAsync(st.data(), sample_status_.get(), J * 4, cudaMemcpyDeviceToHost, stream_));
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> out(batch.seqs.size(), -1);
    std::vector<std::string> names;
    size_t j = 0;
    for (size_t k = 0; k < batch.seqs.size(); ++k)
      if (batch.seqs[k].sample) {
        names.push_back(fmt::format("seqs[{}]", k));
        out[k] = tok[j++];
      }
    check_sample_status(st, names);
    return out;
  }

  // ---- eager passes (prefill, mixed, large or traced batches) ----

  void run_chunked(const StepBatch& batch, const std::vector<SeqRows>& seqs, float* logits, const PassTrace& tr) {
    // Flatten, then cut into passes of at most max_tokens rows.
    Pass pass;
    int out_row = 0;
    auto flush = [&] {
      if (pass.ids.empty()) return;
      const int R = int(pass.out_rows.size());
      run_pass(pass, logits ? logits + size_t(out_row) * spec_.vocab_size : nullptr, tr, out_row);
      out_row += R;
      pass = Pass{};
    };
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqStep& q = batch.seqs[i];
      const int n = int(q.tokens.size());
      for (int j = 0; j < n;) {
        if (int(pass.ids.size()) == opt_.max_tokens) flush();
        const int take = std::min(n - j, opt_.max_tokens - int(pass.ids.size()));
        SeqRows r = seqs[i];
        r.start_pos = seqs[i].start_pos + j;
        r.num_new = take;
        const int64_t need = (int64_t(r.start_pos) + take + spec_.index_block - 1) / spec_.index_block;
        r.block_table = seqs[i].block_table.subspan(0, size_t(need));
        const int row0 = int(pass.ids.size());
        for (int k = 0; k < take; ++k) {
          pass.ids.push_back(q.tokens[size_t(j + k)]);
          if (q.all_logits || j + k == n - 1) pass.out_rows.push_back(row0 + k);
        }
        pass.seqs.push_back(r);
        j += take;
      }
    }
    flush();
  }

  void run_pass(const Pass& pass, float* logits, const PassTrace& tr, int out_row0) {
    ++stats_.eager_passes;
    StepMetadata m = build_step_metadata(pass.seqs, spec_.index_block, opt_.num_cache_blocks);
    const int T = m.num_tokens;
    meta_->upload(m, stream_);
    M3_CUDA_CHECK(cudaMemcpyAsync(ids_.get(), pass.ids.data(), size_t(T) * 4, cudaMemcpyHostToDevice, stream_));
    pass_slots_ = &m.slots;
    forward_layers(T, meta_->view(), m.max_context, *lin_eager_, (tr.sel ? &tr : nullptr), T, &m.positions);
    const int R = int(pass.out_rows.size());
    M3_CUDA_CHECK(cudaMemcpyAsync(rows_.get(), pass.out_rows.data(), size_t(R) * 4, cudaMemcpyHostToDevice, stream_));
    // Gather the output rows in groups that fit the gather buffer, lm_head each group.
    const int gcap = int(gather_.bytes() / (size_t(spec_.hidden) * 4));
    for (int r0 = 0; r0 < R; r0 += gcap) {
      const int r = std::min(gcap, R - r0);
      gather_rows(a_.get<float>(), spec_.hidden, rows_.get<int32_t>() + r0, r, spec_.hidden, gather_.get<float>(),
                  spec_.hidden, stream_);
      lm_head_to_host(gather_.get<float>(), r, *lin_eager_, logits ? logits + size_t(r0) * spec_.vocab_size : nullptr,
                      out_row0 + r0);
    }
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ---- decode buckets ----

  // Metadata of a decode bucket: padded to B rows, tables padded to the fixed width, launches
  // sized for max_model_len (so the launch sequence does not depend on the contexts).
  StepMetadata bucket_metadata(const std::vector<SeqRows>& seqs, int B) const {
    StepMetadata m = build_step_metadata(seqs, spec_.index_block, opt_.num_cache_blocks, B);
    std::vector<int32_t> t(size_t(m.num_seqs) * size_t(table_width_), -1);
    for (int i = 0; i < m.num_seqs; ++i)
      std::copy_n(m.block_tables.begin() + ptrdiff_t(i) * m.table_width, m.table_width,
                  t.begin() + ptrdiff_t(i) * table_width_);
    m.block_tables = std::move(t);
    m.table_width = table_width_;
    return m;
  }

  StepMetadataView bucket_view() const {
    StepMetadataView v = meta_->view();
    v.table_width = table_width_;
    v.max_context = opt_.max_model_len;
    return v;
  }

  // The launches of one bucket step (what a graph captures): layers, final norm, lm_head.
  void bucket_launches(int B) {
    forward_layers(B, bucket_view(), opt_.max_model_len, *lin_decode_, nullptr, B, nullptr);
    linear_dense(w_->lm_head(), ActIn{a_.get(), DType::F32, spec_.hidden}, B, logits_.get<float>(), spec_.vocab_size,
                 stream_, lin_decode_.get(), path_);
  }

  std::array<void*, 4> decode_scratch() {
    std::array<void*, 4> s{};
    for (int i = 0; i < 4; ++i) s[size_t(i)] = lin_decode_->scratch(i, 0);
    return s;
  }

  // Runs the largest bucket once over padding rows only: grows the decode GEMM scratch to its
  // final size (so graphs captured later never see it move) and initializes cuBLASLt.
  void warm_up_decode() {
    const int B = opt_.max_graph_batch;
    StepMetadata m = bucket_metadata({}, B);
    meta_->upload(m, stream_);
    std::vector<int32_t> ids(size_t(B), 0);
    M3_CUDA_CHECK(cudaMemcpyAsync(ids_.get(), ids.data(), size_t(B) * 4, cudaMemcpyHostToDevice, stream_));
    bucket_launches(B);
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Uploads a decode batch's bucket metadata and token ids (asynchronously: the host vectors are
  // pageable, so the copies are staged before this returns). Returns the bucket.
  int upload_decode(const StepBatch& batch, const std::vector<SeqRows>& seqs) {
    const int n = int(batch.seqs.size());
    const int B = decode_bucket(n);
    StepMetadata m = bucket_metadata(seqs, B);
    meta_->upload(m, stream_);
    std::vector<int32_t> ids(size_t(B), 0);  // padding rows embed token 0 (never written, logits dropped)
    for (int i = 0; i < n; ++i) ids[size_t(i)] = batch.seqs[size_t(i)].tokens[0];
    M3_CUDA_CHECK(cudaMemcpyAsync(ids_.get(), ids.data(), size_t(B) * 4, cudaMemcpyHostToDevice, stream_));
    return B;
  }

  void run_decode(const StepBatch& batch, const std::vector<SeqRows>& seqs, float* logits) {
    const int n = int(batch.seqs.size());
    ++stats_.bucket_steps;
    const int B = upload_decode(batch, seqs);
    const bool graphs = opt_.cuda_graphs && !obs_;  // an observer sees eager launches, never a replay

    int bi = 0;
    while ((1 << bi) < B) ++bi;
    Graph& g = graphs_[size_t(bi)];
    if (graphs && g.exec && g.scratch != decode_scratch()) {  // captured buffers moved
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
    }
    if (graphs && g.exec) {
      M3_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
      ++stats_.graph_replays;
    } else {
      bucket_launches(B);
      if (graphs) capture(B, g);
    }
    sample_rows(0, n);  // eagerly, after the replay (outside the graph)
    if (logits)
      M3_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.get(), size_t(n) * spec_.vocab_size * 4, cudaMemcpyDeviceToHost,
                                    stream_));
    M3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Captures bucket B's launches (nothing runs during a capture). On failure graphs are turned off
  // and the error is rethrown.
  void capture(int B, Graph& g) {
    cudaGraph_t graph = nullptr;
    M3_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
      bucket_launches(B);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      opt_.cuda_graphs = false;
      throw;
    }
    M3_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaError_t e = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      g.exec = nullptr;
      opt_.cuda_graphs = false;
      M3_FAIL("cuda backend: instantiating the decode graph of bucket {} failed: {}", B, cudaGetErrorString(e));
    }
    g.scratch = decode_scratch();
    ++stats_.graph_captures;
  }

  std::shared_ptr<const PreparedWeights> w_;
  CudaBackendOptions opt_;
  ModelSpec spec_;
  cudaStream_t stream_ = nullptr;
  int sms_ = 0;
  int logits_rows_ = 0;
  int table_width_ = 0;
  int64_t proj_ld_ = 0, ld_h_ = 0;
  LinearPath path_ = LinearPath::Auto;
  std::unique_ptr<DeviceKvCache> own_cache_;  // null when the cache is borrowed
  DeviceKvCache* cache_ = nullptr;
  std::unique_ptr<DeviceRope> rope_;
  std::unique_ptr<DeviceStepMetadata> meta_;
  std::unique_ptr<LinearContext> lin_eager_, lin_decode_;
  std::vector<Fp8Weight> qkv_, o_w_;
  std::vector<LayerNormWeights> norms_;
  std::vector<MoeWeights> moe_w_;
  std::vector<std::array<const float*, 4>> qk_norms_;  // q, k, iq, ik (fp32 device)
  static constexpr int kMaxAttnChunks = 256;                   // chunk states per row (combine smem)
  static constexpr size_t kMaxAttnWorkspace = size_t(512) << 20;  // bytes for the multi-block mode
  int tiles_per_chunk_[2] = {kDefaultTilesPerChunk, kDefaultTilesPerChunk};  // [dense, sparse]
  DevBuf x_, f_, a_, proj_, q_, o_, iq_, ids_, rows_, gather_, logits_, h_, moe_ws_, idx_ws_, sel_, attn_ws_, norm_f32_;
  std::vector<int32_t> written_;  // per cache slot: the position it holds, -1 = nothing
  std::array<Graph, kMaxBuckets> graphs_{};
  CudaBackendStats stats_;
  BlockScoreTrace* score_trace_ = nullptr;
  const std::vector<int32_t>* pass_slots_ = nullptr;  // the eager pass's slots (cache trace)
  StepObserver* obs_ = nullptr;          // benchmark observer of the launches being enqueued
  int prepared_bucket_ = 0;              // bucket of the last prepare_decode (0: none valid)
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  std::unique_ptr<DeviceSampler> sampler_;       // created by the first step that samples
  std::vector<kernels::SampleJob> sample_jobs_;  // this step's, in output-row order
  DevBuf sample_tokens_, sample_status_;         // int32 per job
};

}  // namespace

int decode_bucket(int n) {
  M3_CHECK(n >= 1, "decode bucket: {} sequences", n);
  int b = 1;
  while (b < n) b <<= 1;
  return b;
}

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
