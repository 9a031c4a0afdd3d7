// RefBackendImpl: owns the spec, fp32 weights, the paged caches (and their codecs) and a thread
// pool; step() / step_following() plan (validate) the batch, mark the slots they write, then run
// forward_step.
#include "ref/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "model/prepare.h"
#include "model/tp_shard.h"
#include "ref/check_model.h"
#include "ref/forward.h"
#include "ref/kv_cache.h"
#include "ref/rope.h"
#include "ref/step_plan.h"
#include "runtime/communicator.h"
#include "runtime/step_sampling.h"

namespace m3::ref {

namespace {

class RefBackendImpl final : public RefBackend {
 public:
  // comm: this rank's communicator when spec / w are one rank's shard (tensor parallelism).
  RefBackendImpl(ModelSpec spec, ModelWeights w, RefOptions opt, Communicator* comm = nullptr)
      : comm_(comm),
        spec_(std::move(spec)),
        w_(std::move(w)),
        pool_(opt.threads),
        cache_((check_ref_spec(spec_), spec_), opt.num_cache_blocks),
        rope_(spec_.rotary_dim, spec_.rope_theta),
        codecs_(make_cache_codecs(spec_, opt.cache)),
        ffn_tap_(std::move(opt.ffn_tap)) {
    check_ref_weights(spec_, w_, comm_ ? comm_->size() : 1);
  }
  std::string name() const override { return "cpu-ref"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return cache_.block_size(); }
  int num_cache_blocks() const override { return cache_.num_blocks(); }
  bool returns_aux() const override { return true; }

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
                     ffn_tap_ ? &ffn_tap_ : nullptr, comm_};
    StepOutput out = forward_step(c, plan, trace);
    sample_step_on_host(batch, out);  // exact: sample_token on these logits (SeqStep::sample)
    return out;
  }

  Communicator* comm_;
  ModelSpec spec_;
  ModelWeights w_;
  ThreadPool pool_;
  PagedCache cache_;
  Rope rope_;
  CacheCodecs codecs_;
  FfnInputTap ffn_tap_;
};

// tp ranks as threads: every step runs on all of them at once (one thread each), each rank's
// forward meeting the others in the collectives of its communicator; rank 0's output is the step's
// (every rank holds the same logits and samples). A rank that throws leaves the group (comm.fail),
// so the others fail too instead of waiting; the first rank's error (by rank) is rethrown.
// The whole model's trace from the ranks' (rank r holds KV groups [r G/N, (r+1) G/N) and the same
// slice, kv_width values, of every token's K / V cache row, or with `rep` > 1 the one group it
// shares with the rep - 1 ranks after it: the first of them speaks for it; experts and index-K are
// the same on every rank: rank 0's, checked).
void merge_traces(std::vector<SelectionTrace>& ranks, int64_t kv_width, size_t rep, SelectionTrace& out) {
  const bool rec = out.record_cache;
  const size_t N = ranks.size();
  for (size_t r = 1; r < N; ++r)
    M3_CHECK(ranks[r].layers == ranks[0].layers && ranks[r].moe_layers == ranks[0].moe_layers &&
                 ranks[r].experts == ranks[0].experts && ranks[r].cache_ik == ranks[0].cache_ik,
             "cpu-ref tp{}: rank {} chose other experts or wrote another index-K than rank 0", N, r);
  out.clear();
  out.record_cache = rec;
  out.layers = ranks[0].layers;
  out.moe_layers = ranks[0].moe_layers;
  out.experts = ranks[0].experts;
  out.cache_ik = ranks[0].cache_ik;
  out.blocks = ranks[0].blocks;
  for (size_t r = rep; r < N; r += rep)
    for (size_t l = 0; l < out.blocks.size(); ++l)
      for (size_t tok = 0; tok < out.blocks[l].size(); ++tok) {
        auto& g = out.blocks[l][tok];
        g.insert(g.end(), ranks[r].blocks[l][tok].begin(), ranks[r].blocks[l][tok].end());
      }
  for (auto kind : {&SelectionTrace::cache_k, &SelectionTrace::cache_v}) {
    auto& merged = out.*kind;
    merged.resize((ranks[0].*kind).size());
    for (size_t l = 0; l < merged.size(); ++l) {
      const size_t tokens = (ranks[0].*kind)[l].size() / size_t(kv_width), parts = N / rep;
      merged[l].resize(tokens * parts * size_t(kv_width));
      for (size_t t = 0; t < tokens; ++t)
        for (size_t k = 0; k < parts; ++k)
          std::copy_n((ranks[k * rep].*kind)[l].data() + t * size_t(kv_width), kv_width,
                      merged[l].data() + (t * parts + k) * size_t(kv_width));
    }
  }
}

// One rank's shard of the weights, built when the rank is.
using RankWeights = std::function<ModelWeights(int rank)>;

// A trace as bytes (the parts merge_traces reads) and back, for ranks in other processes.
template <class T>
void put(std::vector<uint8_t>& b, const T* p, size_t n) {
  const uint64_t k = n;
  const auto* q = reinterpret_cast<const uint8_t*>(&k);
  b.insert(b.end(), q, q + 8);
  if (n) b.insert(b.end(), reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p + n));
}
template <class T>
std::vector<T> get(const uint8_t*& p, const uint8_t* end) {
  uint64_t n;
  M3_CHECK(end - p >= 8, "tensor-parallel trace: truncated");
  std::memcpy(&n, p, 8);
  p += 8;
  M3_CHECK(uint64_t(end - p) >= n * sizeof(T), "tensor-parallel trace: truncated");
  std::vector<T> v(n);
  if (n) std::memcpy(v.data(), p, n * sizeof(T));
  p += n * sizeof(T);
  return v;
}
std::vector<uint8_t> trace_bytes(const SelectionTrace& t) {
  std::vector<uint8_t> b;
  put(b, t.layers.data(), t.layers.size());
  put(b, t.moe_layers.data(), t.moe_layers.size());
  auto lists = [&](const std::vector<std::vector<int32_t>>& v) {
    const uint64_t n = v.size();
    put(b, &n, 1);
    for (const auto& x : v) put(b, x.data(), x.size());
  };
  for (const auto& l : t.blocks) {
    const uint64_t n = l.size();
    put(b, &n, 1);
    for (const auto& tok : l) lists(tok);
  }
  for (const auto& l : t.experts) lists(l);
  for (auto* kind : {&t.cache_k, &t.cache_v, &t.cache_ik}) {
    const uint64_t n = kind->size();
    put(b, &n, 1);
    for (const auto& row : *kind) put(b, row.data(), row.size());
  }
  return b;
}
SelectionTrace trace_from(const uint8_t* p, const uint8_t* end) {
  SelectionTrace t;
  t.layers = get<int>(p, end);
  t.moe_layers = get<int>(p, end);
  auto count = [&] { return get<uint64_t>(p, end).at(0); };
  auto lists = [&] {
    std::vector<std::vector<int32_t>> v(count());
    for (auto& x : v) x = get<int32_t>(p, end);
    return v;
  };
  t.blocks.resize(t.layers.size());
  for (auto& l : t.blocks) {
    l.resize(count());
    for (auto& tok : l) tok = lists();
  }
  t.experts.resize(t.moe_layers.size());
  for (auto& l : t.experts) l = lists();
  for (auto* kind : {&t.cache_k, &t.cache_v, &t.cache_ik}) {
    kind->resize(count());
    for (auto& row : *kind) row = get<float>(p, end);
  }
  return t;
}

// This process's rank of an MPI job (RefOptions::comm): its shard only; a trace is gathered from
// every rank (sizes first, then the padded bytes) and merged as the threaded ranks' are.
class RefRankBackend final : public RefBackend {
 public:
  RefRankBackend(ModelSpec spec, const RankWeights& weights, RefOptions opt) : spec_(spec), comm_(opt.comm) {
    const int N = comm_->size();
    RefOptions ro = opt;
    ro.tp = 1;
    ro.comm = nullptr;
    rank_ = std::make_unique<RefBackendImpl>(tp_rank_spec(spec, N), weights(comm_->rank()), ro, comm_.get());
  }
  std::string name() const override { return fmt::format("cpu-ref tp{} (mpi rank {})", comm_->size(), comm_->rank()); }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return rank_->cache_block_size(); }
  int num_cache_blocks() const override { return rank_->num_cache_blocks(); }
  bool returns_aux() const override { return true; }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    SelectionTrace mine;
    if (trace) mine.record_cache = trace->record_cache;
    // Every rank validates the same batch the same way, so a bad batch throws on all of them before
    // any collective and the group goes on; a failure on one rank only (out of memory) leaves the
    // others in a collective until the MPI engine's timeout aborts the job.
    StepOutput out = rank_->step(batch, trace ? &mine : nullptr);
    const int wants = trace ? 1 : 0;
    std::vector<int> all_want(size_t(comm_->size()));
    comm_->all_gather(&wants, all_want.data(), sizeof(int));
    for (int r = 0; r < comm_->size(); ++r)
      M3_CHECK(all_want[r] == wants, "cpu-ref tp{}: rank {} asked for a trace and rank {} did not", comm_->size(),
               wants ? comm_->rank() : r, wants ? r : comm_->rank());
    if (!trace) return out;
    const std::vector<uint8_t> bytes = trace_bytes(mine);
    const int N = comm_->size();
    std::vector<uint64_t> sizes(static_cast<size_t>(N));
    const uint64_t n = bytes.size();
    comm_->all_gather(&n, sizes.data(), 8);
    const uint64_t most = *std::max_element(sizes.begin(), sizes.end());
    std::vector<uint8_t> padded(most, 0), all(most * size_t(N));
    std::copy(bytes.begin(), bytes.end(), padded.begin());
    comm_->all_gather(padded.data(), all.data(), most);
    std::vector<SelectionTrace> ranks;
    for (int r = 0; r < N; ++r)
      ranks.push_back(trace_from(all.data() + size_t(r) * most, all.data() + size_t(r) * most + sizes[size_t(r)]));
    const int KV = spec_.num_kv_heads;
    merge_traces(ranks, rank_->spec().kv_dim(), KV % N == 0 ? 1 : size_t(N / KV), *trace);
    return out;
  }
  StepOutput step_following(const StepBatch&, const SelectionTrace&, const FollowOptions&, FollowStats*,
                            SelectionTrace*) override {
    M3_FAIL("cpu-ref tp{}: step_following follows one rank's choices (run the reference with tp 1)", comm_->size());
  }

 private:
  ModelSpec spec_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<RefBackendImpl> rank_;
};

class RefTpBackend final : public RefBackend {
 public:
  RefTpBackend(ModelSpec spec, const RankWeights& weights, RefOptions opt) : spec_(spec), group_(opt.tp) {
    const int N = opt.tp;
    const ModelSpec rs = tp_rank_spec(spec, N);
    const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
    RefOptions ro = opt;
    ro.tp = 1;
    ro.threads = std::max(1, (opt.threads > 0 ? opt.threads : hw) / N);
    for (int r = 0; r < N; ++r) {
      comms_.push_back(group_.rank(r));
      ranks_.push_back(std::make_unique<RefBackendImpl>(rs, weights(r), ro, comms_.back().get()));
    }
  }
  std::string name() const override { return fmt::format("cpu-ref tp{}", ranks_.size()); }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return ranks_[0]->cache_block_size(); }
  int num_cache_blocks() const override { return ranks_[0]->num_cache_blocks(); }
  bool returns_aux() const override { return true; }

  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    const size_t N = ranks_.size();
    std::vector<StepOutput> outs(N);
    std::vector<SelectionTrace> traces(trace ? N : 0);
    std::vector<std::string> errors(N);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < N; ++r)
      threads.emplace_back([&, r] {
        try {
          if (trace) traces[r].record_cache = trace->record_cache;
          outs[r] = ranks_[r]->step(batch, trace ? &traces[r] : nullptr);
        } catch (const std::exception& e) {
          errors[r] = e.what();
          comms_[r]->fail(errors[r]);
        }
      });
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < N; ++r) M3_CHECK(errors[r].empty(), "cpu-ref tp{} rank {}: {}", N, r, errors[r]);
    if (trace) {
      const int KV = spec_.num_kv_heads;
      merge_traces(traces, ranks_[0]->spec().kv_dim(), KV % int(N) == 0 ? 1 : N / size_t(KV), *trace);
    }
    return std::move(outs[0]);
  }

  StepOutput step_following(const StepBatch&, const SelectionTrace&, const FollowOptions&, FollowStats*,
                            SelectionTrace*) override {
    M3_FAIL("cpu-ref tp{}: step_following follows one rank's choices (run the reference with tp 1)", ranks_.size());
  }

 private:
  ModelSpec spec_;
  LocalGroup group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RefBackendImpl>> ranks_;
};

}  // namespace

namespace {
std::unique_ptr<RefBackend> make_sharded(ModelSpec spec, const RankWeights& weights, const RefOptions& opt) {
  check_ref_spec(spec);
  tp_rank_spec(spec, opt.tp);  // a split that does not divide fails here, naming the dimension
  if (opt.comm) {
    M3_CHECK(opt.comm->size() == opt.tp, "reference backend: --tp {} in a group of {} processes (mpirun -np {})", opt.tp,
             opt.comm->size(), opt.comm->size());
    return std::make_unique<RefRankBackend>(std::move(spec), weights, opt);
  }
  return std::make_unique<RefTpBackend>(std::move(spec), weights, opt);
}
void check_options(const RefOptions& opt) {
  M3_CHECK(opt.threads >= 0, "reference backend: threads must be >= 0, got {}", opt.threads);
  M3_CHECK(opt.tp >= 1, "reference backend: tensor-parallel size must be >= 1, got {}", opt.tp);
}
}  // namespace

std::unique_ptr<RefBackend> make_ref_backend(ModelSpec spec, ModelWeights weights, RefOptions opt) {
  check_options(opt);
  if (opt.tp > 1 || opt.comm) {
    check_ref_spec(spec);
    check_ref_weights(spec, weights);
    return make_sharded(spec, [&](int r) { return tp_rank_weights(spec, weights, r, opt.tp); }, opt);
  }
  return std::make_unique<RefBackendImpl>(std::move(spec), std::move(weights), opt);
}

std::unique_ptr<RefBackend> make_ref_backend(ModelSpec spec, const WeightSource& src, RefOptions opt) {
  check_options(opt);
  if (opt.tp > 1 || opt.comm)
    return make_sharded(spec, [&](int r) { return tp_rank_weights(spec, src, r, opt.tp); }, opt);
  return std::make_unique<RefBackendImpl>(spec, tp_rank_weights(spec, src, 0, 1), opt);
}

std::unique_ptr<RefBackend> make_ref_backend_from_ranks(ModelSpec spec,
                                                       const std::function<ModelWeights(int rank)>& rank_weights,
                                                       RefOptions opt) {
  check_options(opt);
  M3_CHECK(rank_weights != nullptr, "reference backend: no rank weights");
  if (opt.tp > 1 || opt.comm) return make_sharded(std::move(spec), rank_weights, opt);
  ModelWeights w = rank_weights(0);
  return std::make_unique<RefBackendImpl>(std::move(spec), std::move(w), opt);
}

}  // namespace m3::ref
