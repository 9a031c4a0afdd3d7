// Graph capture / replay timing and per-op spans (graph_timer.h).
#include "bench/cuda/graph_timer.h"

#include <map>

#include "native/cuda_check.h"

namespace m3::bench {

CudaStream::CudaStream() { M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() {
  if (s) cudaStreamDestroy(s);
}

namespace {

struct Graph {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t x = nullptr;
  ~Graph() {
    if (x) cudaGraphExecDestroy(x);
    if (g) cudaGraphDestroy(g);
  }
};

void capture(Graph& G, cudaStream_t s, const std::function<void(cudaStream_t)>& fn) {
  M3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    fn(s);
  } catch (...) {
    cudaGraph_t junk = nullptr;
    cudaStreamEndCapture(s, &junk);
    if (junk) cudaGraphDestroy(junk);
    throw;
  }
  M3_CUDA_CHECK(cudaStreamEndCapture(s, &G.g));
  M3_CUDA_CHECK(cudaGraphInstantiate(&G.x, G.g, 0));
}

void count_nodes(cudaGraph_t g, int* all, int* kernels) {
  size_t n = 0;
  M3_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) M3_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  int k = 0;
  for (auto node : nodes) {
    cudaGraphNodeType t;
    M3_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel) ++k;
  }
  *all = int(n);
  *kernels = k;
}

struct Events {
  std::vector<cudaEvent_t> e;
  explicit Events(size_t n) : e(n) {
    for (auto& x : e) M3_CUDA_CHECK(cudaEventCreate(&x));
  }
  ~Events() {
    for (auto x : e) cudaEventDestroy(x);
  }
};

}  // namespace

GraphTiming time_graph(const Enqueue& fn, cudaStream_t s, int warmup, int steps, const Enqueue& between) {
  M3_CHECK(steps >= 1 && warmup >= 0, "bench: steps {} / warm-up {}", steps, warmup);
  Graph G;
  capture(G, s, fn);
  GraphTiming t;
  count_nodes(G.g, &t.nodes, &t.kernels);
  for (int i = 0; i < warmup; ++i) {
    if (between) between(s);
    M3_CUDA_CHECK(cudaGraphLaunch(G.x, s));
  }
  // with `between`: a start and an end event per replay; without: back-to-back replays, the end
  // of one replay is the start of the next
  Events ev(between ? 2 * size_t(steps) : size_t(steps) + 1);
  if (!between) M3_CUDA_CHECK(cudaEventRecord(ev.e[0], s));
  for (int i = 0; i < steps; ++i) {
    if (between) {
      between(s);
      M3_CUDA_CHECK(cudaEventRecord(ev.e[2 * size_t(i)], s));
    }
    M3_CUDA_CHECK(cudaGraphLaunch(G.x, s));
    M3_CUDA_CHECK(cudaEventRecord(ev.e[between ? 2 * size_t(i) + 1 : size_t(i) + 1], s));
  }
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    float ms = 0;
    const size_t a = between ? 2 * size_t(i) : size_t(i);
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.e[a], ev.e[a + 1]));
    us[size_t(i)] = double(ms) * 1e3;
  }
  t.us = summarize(us);
  return t;
}

namespace {

class EventRecorder final : public OpRecorder {
 public:
  struct Mark {
    std::string op;
    int layer;
    cudaEvent_t ev;
    size_t nodes_before;  // nodes of the capture when the mark was made
  };
  std::vector<Mark> marks;
  ~EventRecorder() override {
    for (auto& m : marks) cudaEventDestroy(m.ev);
  }
  void mark(cudaStream_t s, const char* op, int layer) override {
    cudaEvent_t e;
    M3_CUDA_CHECK(cudaEventCreate(&e));
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t g = nullptr;
    size_t nodes = 0;
    M3_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &st, nullptr, &g));
    const bool capturing = st == cudaStreamCaptureStatusActive;
    if (capturing && g) M3_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    marks.push_back(Mark{op, layer, e, nodes});
    // External: a timing event-record node in the captured graph (not a capture dependency).
    if (capturing) M3_CUDA_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
    else M3_CUDA_CHECK(cudaEventRecord(e, s));
  }
};

}  // namespace

std::vector<OpSpan> time_ops(const std::function<void(cudaStream_t, OpRecorder*)>& fn, cudaStream_t s, int reps,
                             const Enqueue& between) {
  M3_CHECK(reps >= 1, "bench: op timing reps {}", reps);
  EventRecorder rec;
  Graph G;
  capture(G, s, [&](cudaStream_t st) {
    fn(st, &rec);
    rec.mark(st, "end", -1);
  });
  const size_t n = rec.marks.size();
  std::vector<std::vector<double>> spans(n > 0 ? n - 1 : 0);
  M3_CUDA_CHECK(cudaGraphLaunch(G.x, s));  // warm-up
  for (int r = 0; r < reps; ++r) {
    if (between) between(s);
    M3_CUDA_CHECK(cudaGraphLaunch(G.x, s));
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i + 1 < n; ++i) {
      float ms = 0;
      M3_CUDA_CHECK(cudaEventElapsedTime(&ms, rec.marks[i].ev, rec.marks[i + 1].ev));
      spans[i].push_back(double(ms) * 1e3);
    }
  }
  std::vector<OpSpan> out;
  for (size_t i = 0; i + 1 < n; ++i) out.push_back(OpSpan{rec.marks[i].op, rec.marks[i].layer, summarize(spans[i]).median,
                         int(rec.marks[i + 1].nodes_before - rec.marks[i].nodes_before) - 1});
  return out;
}

EagerTiming time_eager(const std::function<void(cudaStream_t, OpRecorder*)>& fn, cudaStream_t s, int steps,
                       const Enqueue& between) {
  M3_CHECK(steps >= 1, "bench: eager steps {}", steps);
  Events ev(2);
  std::vector<double> us;
  std::vector<std::vector<double>> spans;
  EagerTiming t;
  for (int r = 0; r < steps; ++r) {
    if (between) between(s);
    EventRecorder rec;
    M3_CUDA_CHECK(cudaEventRecord(ev.e[0], s));
    fn(s, &rec);
    M3_CUDA_CHECK(cudaEventRecord(ev.e[1], s));
    rec.mark(s, "end", -1);
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.e[0], ev.e[1]));
    us.push_back(double(ms) * 1e3);
    const size_t n = rec.marks.size();
    if (r == 0) {
      spans.assign(n > 0 ? n - 1 : 0, {});
      for (size_t i = 0; i + 1 < n; ++i) t.spans.push_back(OpSpan{rec.marks[i].op, rec.marks[i].layer, 0, -1});
    }
    M3_CHECK(n == spans.size() + 1, "bench: eager run {} made {} marks, the first made {}", r, n, spans.size() + 1);
    for (size_t i = 0; i + 1 < n; ++i) {
      M3_CUDA_CHECK(cudaEventElapsedTime(&ms, rec.marks[i].ev, rec.marks[i + 1].ev));
      spans[i].push_back(double(ms) * 1e3);
    }
  }
  t.us = summarize(us);
  for (size_t i = 0; i < t.spans.size(); ++i) t.spans[i].us = summarize(spans[i]).median;
  return t;
}

}  // namespace m3::bench
