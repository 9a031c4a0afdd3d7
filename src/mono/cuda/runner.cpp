// The mono runtime (mono/mono.h): creation (static refusals, co-resident capacity), the per-plan
// programs (task tables uploaded once per decode bucket, at its first eager step), the launch, and
// the error record.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <tuple>

#include "mono/cuda/kernel.h"
#include "mono/lifecycle.h"
#include "mono/mono.h"
#include "native/cuda_check.h"
#include "native/dev_buf.h"
#include "native/forward_model.h"

namespace m3::mono {

std::string Refusal::text() const {
  std::string s = "mono refused:";
  for (const auto& r : reasons) s += "\n  " + r;
  return s;
}

namespace {

// One decode bucket's program on the device.
struct Program {
  const native::LayerPlan* plan = nullptr;
  size_t num_ops = 0;
  TaskTable table;
  int build = 0;  // the kernel build that has the table's codes (kernel.h, build_of)
  native::DevBuf ops, tasks, cta_begin, counters, epochs, seq, trace;
};

class Runner final : public MonoRunner {
 public:
  Runner(const native::ForwardModel& m, const MonoOptions& o, int grid, int max_smem)
      : model_(m), opt_(o), grid_(grid), max_smem_(max_smem) {
    M3_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&error_host_), sizeof(MonoError), cudaHostAllocMapped));
    *error_host_ = MonoError{};
    M3_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev_), error_host_, 0));
    abort_ = native::DevBuf(128);
    M3_CUDA_CHECK(cudaMemset(abort_.get(), 0, 128));
    life_.bind();
  }
  ~Runner() override { close(); }

  std::string name() const override { return "mono"; }
  int grid() const override { return grid_; }

  std::string refusal(const StepBatch& b) override {
    if (std::string u = life_.usable(); !u.empty()) return u;
    return step_refusal(b, opt_.rules);
  }

  void run_layers(const native::LayerPlan& plan, native::LayerRange range, cudaStream_t stream) override {
    M3_CHECK(life_.usable().empty(), "mono: run_layers in state {}", state_name(life_.state()));
    try {
      launch(program(plan, range, stream), stream);
    } catch (const Error& e) {
      life_.fail(e.what());  // every later step is refused ("broken"); the backend re-runs this one natively
      throw;
    }
  }

  void launch(const Program& p, cudaStream_t stream) {
    KernelArgs a;
    a.ops = p.ops.get<MonoOp>();
    a.tasks = p.tasks.get<MonoTask>();
    a.cta_begin = p.cta_begin.get<int32_t>();
    a.counters = p.counters.get<unsigned long long>();
    a.epochs = p.epochs.get<unsigned long long>();
    a.seq = p.seq.get<unsigned long long>();
    a.abort = abort_.get<uint32_t>();
    a.error = error_dev_;
    a.num_tasks = p.table.num_tasks();
    a.watchdog_ns = uint64_t(opt_.watchdog_ms * 1e6);
    a.serialized = opt_.serialized ? 1 : 0;
    a.fault_op = opt_.fault_op;
    a.poll_ns = uint32_t(opt_.poll_ns);
    a.fence = opt_.fence ? 1 : 0;
    a.trace = opt_.trace ? p.trace.get<unsigned long long>() : nullptr;
    launch_kernel(a, grid_, std::max(p.table.max_smem, std::min(opt_.smem_min, max_smem_)), p.build, stream);
    last_ = &p;
  }

  std::string take_error() override {
    if (!error_host_ || error_host_->code == 0) return "";
    const MonoError e = *error_host_;
    std::string what = fmt::format(
        "mono watchdog: CTA {} task {} (op {} '{}' of layer {}) waited over {} ms on {} {} for {} (it held {})", e.cta,
        e.task, e.op, describe_op(e.op), e.layer, opt_.watchdog_ms, e.wait_op == -2 ? "the serial counter" : "op",
        e.wait_op == -2 ? std::string() : fmt::format("{} '{}'", e.wait_op, describe_op(e.wait_op)), e.target, e.value);
    life_.fail(what);
    return what;
  }

  void close() override {
    if (life_.state() == State::Closed) return;
    life_.close();
    programs_.clear();
    if (error_host_) cudaFreeHost(error_host_);
    error_host_ = nullptr;
  }

  std::vector<TaskTrace> trace() override {
    std::vector<TaskTrace> out;
    if (!opt_.trace || !last_) return out;
    const TaskTable& t = last_->table;
    std::vector<unsigned long long> st(size_t(t.num_tasks()) * 3);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    M3_CUDA_CHECK(cudaMemcpy(st.data(), last_->trace.get(), st.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (auto v : st)
      if (v) t0 = std::min(t0, v);
    for (size_t i = 0; i < t.ops.size(); ++i)
      for (int64_t w = 0; w < t.ops[i].items; ++w) {
        const unsigned long long* s = st.data() + 3 * (t.ops[i].first_task + w);
        TaskTrace x;
        x.op = int(i);
        x.item = int(w);
        x.layer = t.ops[i].layer;
        x.code = op_code_name(OpCode(t.ops[i].code));
        x.wait_begin = double(s[0] - t0);
        x.run_begin = double(s[1] - t0);
        x.end = double(s[2] - t0);
        out.push_back(x);
      }
    return out;
  }

  std::string describe() const override {
    if (!last_) return fmt::format("mono: {} CTAs x {} threads, no program yet", grid_, kCtaThreads);
    return fmt::format(
        "mono: {} CTAs x {} threads, {} ops, {} tasks, {} B shared memory, serialized {}, poll sleep {} ns, "
        "placement {} ({} CTAs reserved for ops of at most {} items), staged tiles: {} projection ops, {} expert ops, "
        "expert ring {}, early split {}, fence {}, streamed projections {}, whole-walk projections {}",
        grid_, kCtaThreads, last_->table.ops.size(), last_->table.num_tasks(), last_->table.max_smem, opt_.serialized,
        opt_.poll_ns, opt_.place.pin ? "by op code" : "round robin", opt_.place.reserve, opt_.place.small,
        staged_ops(1), staged_ops(2), opt_.place.ring, opt_.place.early, opt_.fence,
        count_ops([](const MonoOp& o) { return o.code == uint8_t(OpCode::MmaStreamFp8F32); }),
        count_ops([](const MonoOp& o) { return o.code == uint8_t(OpCode::MmaDecodeFp8SplitWhole); }));
  }
  int staged_ops(int stage) const {
    return count_ops([stage](const MonoOp& o) { return o.stage == stage; });
  }
  template <class F>
  int count_ops(F f) const {
    int n = 0;
    for (const MonoOp& o : last_->table.ops) n += f(o) ? 1 : 0;
    return n;
  }

 private:
  std::string describe_op(int op) const {
    if (!last_ || op < 0 || size_t(op) >= last_->table.ops.size()) return "?";
    return op_code_name(OpCode(last_->table.ops[size_t(op)].code));
  }

  // The program of a plan, built and uploaded the first time (eagerly: never while the stream is
  // being captured).
  const Program& program(const native::LayerPlan& plan, native::LayerRange range, cudaStream_t stream) {
    const ProgramKey key{plan.shape.rows, range.first, range.last};
    auto it = programs_.find(key);
    if (it != programs_.end() && it->second->plan == &plan && it->second->num_ops == plan.ops.size())
      return *it->second;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    M3_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    life_.ready(cs != cudaStreamCaptureStatusNone);
    const auto first = plan.ops.begin() + plan.layer_first_op(range.first);
    const auto last = plan.ops.begin() + plan.layer_first_op(range.last);
    std::vector<std::string> why;
    auto p = std::make_unique<Program>();
    p->plan = &plan;
    p->num_ops = plan.ops.size();
    p->table = build_task_table(std::span<const native::OpCall>(&*first, size_t(last - first)), grid_, kCtaThreads,
                                max_smem_, &why, opt_.place);
    if (p->table.max_smem > max_smem_)
      why.push_back(fmt::format("an op needs {} B of shared memory, the kernel has {}", p->table.max_smem, max_smem_));
    if (why.empty())
      if (std::string bad = check_task_order(p->table); !bad.empty()) why.push_back("task order: " + bad);
    if (!why.empty()) {
      Refusal r{why};
      life_.fail(r.text());
      M3_FAIL("{}", r.text());
    }
    const TaskTable& t = p->table;
    for (const MonoOp& o : t.ops) p->build |= build_of(OpCode(o.code));
    auto up = [](native::DevBuf& b, const void* src, size_t bytes) {
      b = native::DevBuf(std::max<size_t>(bytes, 16));
      M3_CUDA_CHECK(cudaMemcpy(b.get(), src, bytes, cudaMemcpyHostToDevice));
    };
    up(p->ops, t.ops.data(), t.ops.size() * sizeof(MonoOp));
    up(p->tasks, t.tasks.data(), t.tasks.size() * sizeof(MonoTask));
    up(p->cta_begin, t.cta_begin.data(), t.cta_begin.size() * sizeof(int32_t));
    p->counters = native::DevBuf(t.ops.size() * kCounterStride * 8);
    p->epochs = native::DevBuf(size_t(grid_) * 8);
    p->seq = native::DevBuf(128);
    M3_CUDA_CHECK(cudaMemset(p->counters.get(), 0, p->counters.bytes()));
    M3_CUDA_CHECK(cudaMemset(p->epochs.get(), 0, p->epochs.bytes()));
    M3_CUDA_CHECK(cudaMemset(p->seq.get(), 0, p->seq.bytes()));
    if (opt_.trace) {
      p->trace = native::DevBuf(size_t(t.num_tasks()) * 3 * 8);
      M3_CUDA_CHECK(cudaMemset(p->trace.get(), 0, p->trace.bytes()));
    }
    auto& slot = programs_[key];
    slot = std::move(p);
    return *slot;
  }

  const native::ForwardModel& model_;
  MonoOptions opt_;
  int grid_, max_smem_;
  Lifecycle life_;
  MonoError* error_host_ = nullptr;
  MonoError* error_dev_ = nullptr;
  native::DevBuf abort_;
  // by bucket rows and layer range (a step that copies hidden states out of the range runs it in parts)
  using ProgramKey = std::tuple<int, int, int>;
  std::map<ProgramKey, std::unique_ptr<Program>> programs_;
  const Program* last_ = nullptr;
};

}  // namespace

std::variant<std::unique_ptr<MonoRunner>, Refusal> create(const native::ForwardModel& m, const MonoOptions& opt) {
  Refusal r;
  const native::LayerRange range = m.sparse_range();
  const native::KvCacheShape& cs = m.cache().shape();
  r.reasons = static_refusals(m.weights().layout(), CacheFormat{cs.kv_dtype, cs.ik_dtype, cs.block_size}, range.first,
                              range.last);
  if (opt.rules.max_rows < 1 || opt.rules.max_rows > kMaxRows || opt.rules.max_query_len < 1 ||
      opt.rules.max_query_len > kMaxQueryLen)
    r.reasons.push_back(fmt::format("rules: {} rows of up to {} query tokens (mono serves 1 .. {} rows of 1 .. {})",
                                    opt.rules.max_rows, opt.rules.max_query_len, kMaxRows, kMaxQueryLen));
  if (!(opt.watchdog_ms > 0)) r.reasons.push_back(fmt::format("watchdog of {} ms", opt.watchdog_ms));
  if (opt.poll_ns < 0 || opt.poll_ns > 1000000) r.reasons.push_back(fmt::format("poll sleep {} ns", opt.poll_ns));
  if (opt.place.ring < 0 || opt.place.ring > 2)
    r.reasons.push_back(fmt::format("expert ring {} (0 none, 1 all, 2 gate/up)", opt.place.ring));
  if (opt.place.stage < 0 || opt.place.stage > 7)
    r.reasons.push_back(fmt::format("stage mask {} (1 projections, 2 experts, 4 the O projection)", opt.place.stage));
  const int optin = kernel_max_dynamic_smem();
  const int per_sm = kernel_ctas_per_sm(optin);
  const int capacity = per_sm * m.sms();
  if (capacity < 1)
    r.reasons.push_back(fmt::format("co-residency: the kernel ({} threads, {} B shared memory) fits {} CTAs", kCtaThreads,
                                    optin, capacity));
  const int grid = opt.grid > 0 ? opt.grid : capacity;
  if (grid > capacity)
    r.reasons.push_back(fmt::format("co-residency: a grid of {} CTAs, {} fit on this GPU", grid, capacity));
  if (!r.reasons.empty()) return r;
  return std::unique_ptr<MonoRunner>(std::make_unique<Runner>(m, opt, grid, optin));
}

}  // namespace m3::mono
