// The mono path: a fused persistent decode kernel for the sparse layer range, over the very
// weights and caches native loaded (shared/docs/design.md, "The mono contract"). It plugs into the
// native backend as its LayerRangeRunner (native/layer_range.h): CudaBackend offers it every step;
// a step it accepts runs the sparse layers through one cooperative launch, any other runs them
// natively, and the dispatcher counts both and the reasons.
//
// v0 (this version): the tasks are the decode-bucket plan's own ops (the same params the native
// builders made, so the same device functions with the same chain counts and reduction orders:
// bitwise native's results); each op's items are spread over the persistent CTAs, op i waits for
// op i - 1 through an epoch counter (no grid barrier), waits are bounded by a watchdog. Not yet
// the streaming design (loader warps, finer counters): mono-performance.md.
#pragma once
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "mono/eligibility.h"
#include "mono/task_table.h"
#include "native/layer_range.h"

namespace m3::native {
class ForwardModel;
}

namespace m3::mono {

struct MonoOptions {
  StepRules rules;             // per-step eligibility (at most 4 rows, decode)
  bool serialized = false;     // debug: one task at a time in the global order (must give the same bits)
  double watchdog_ms = 100;    // a wait longer than this stops the kernel and breaks the runtime
  int grid = 0;                // CTAs (0: the measured co-resident capacity x SMs)
  int fault_op = -1;           // tests: make the wait of this op unreachable (the watchdog must fire)
  bool trace = false;          // per-task device timestamps of every launch (MonoRunner::trace)
  // Experiments (bench; defaults are the measured best): a waiting thread's sleep between polls,
  // and where the tasks run (mono/task_table.h, TablePlacement).
  int poll_ns = 32;
  TablePlacement place;
  int smem_min = 0;  // launch with at least this much dynamic shared memory (a smaller L1: experiments)
  // fence = false (the default): a run's completion is published by the release add alone, no
  // __threadfence before it (the release is cumulative over the CTA's writes that the barrier
  // orders before it; measured b=1 -2.4%)
  bool fence = false;
};

// Per-task timestamps of the last launch (MonoOptions::trace), ns from the earliest stamp.
struct TaskTrace {
  int op = 0, item = 0, layer = -1;
  std::string code;
  double wait_begin = 0, run_begin = 0, end = 0;
};

struct Refusal {
  std::vector<std::string> reasons;
  std::string text() const;
};

// What the backend needs from a mono runtime beyond the runner interface.
class MonoRunner : public native::LayerRangeRunner {
 public:
  // The error of the last launch ("" when it completed), read after the step's stream sync; a
  // non-empty result leaves the runtime broken (every later step is refused: "broken").
  virtual std::string take_error() = 0;
  virtual void close() = 0;  // idempotent
  virtual int grid() const = 0;
  virtual std::string describe() const = 0;  // grid, threads, shared memory, tasks of the last program
  // The last launch's per-task stamps (synchronizes the device; empty without MonoOptions::trace).
  virtual std::vector<TaskTrace> trace() = 0;
};

// Per op code: tasks, mean waiting and running time per task, the span of the ops of that code
// (first item's start to last item's end, summed over the ops) and their mean hop (an op's first
// item start after the last item end of the op before it in the plan): where a launch's time goes.
std::string summarize_trace(const std::vector<TaskTrace>& t);

// Validates (static refusals, co-resident capacity) and creates the runtime: it allocates only
// its task tables, counters and an error record (device memory), never a weight or cache copy.
std::variant<std::unique_ptr<MonoRunner>, Refusal> create(const native::ForwardModel& model, const MonoOptions& opt);

}  // namespace m3::mono
