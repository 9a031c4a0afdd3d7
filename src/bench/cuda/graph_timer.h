// CUDA-graph timing (graph_timer.cpp): capture a step, replay it warm-up + steps times with an
// event pair around each replay, summarize; count the kernel nodes; per-op times from a second
// capture with an event before each op (cudaEventRecordExternal nodes).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/stats.h"
#include "bench/cuda/step_runner.h"

namespace m3::bench {

struct GraphTiming {
  Stats us;          // per replay
  int kernels = 0;   // kernel nodes of the graph
  int nodes = 0;     // all nodes
};
// fn(s) enqueues the work; it is captured once (relaxed capture mode, as CudaBackend captures its
// own decode graphs: its launchers may make calls the global mode forbids) and replayed. between(s),
// when given, is enqueued before every replay OUTSIDE the timed event pair (e.g. an L2 flush, so
// each replay starts cold as a real step after other work would).
using Enqueue = std::function<void(cudaStream_t)>;
GraphTiming time_graph(const Enqueue& fn, cudaStream_t s, int warmup, int steps, const Enqueue& between = {});

struct OpSpan {
  std::string op;
  int layer = -1;
  double us = 0;  // median over replays of the time from this mark to the next (or the end)
  int launches = 0;  // graph nodes (kernels, memsets, copies) the span captured
};
// Per-op spans of fn(s, rec) captured with an event before each mark; replays `reps` times.
std::vector<OpSpan> time_ops(const std::function<void(cudaStream_t, OpRecorder*)>& fn, cudaStream_t s, int reps,
                             const Enqueue& between = {});

// The same for a step that cannot be captured: fn(s, rec) runs eagerly (it must order its work
// after what is on s and make s wait for its end, and call rec before each op). `steps` runs, each
// after between(s) and inside an event pair on s; every run also records its per-op spans (plain
// events: no graph, launches -1), so no extra run is spent on the breakdown.
struct EagerTiming {
  Stats us;
  std::vector<OpSpan> spans;  // median over the runs
};
EagerTiming time_eager(const std::function<void(cudaStream_t, OpRecorder*)>& fn, cudaStream_t s, int steps,
                       const Enqueue& between = {});

// An RAII stream / event / graph holder set used by the harness.
struct CudaStream {
  cudaStream_t s = nullptr;
  CudaStream();
  ~CudaStream();
};

}  // namespace m3::bench
