// CUDA graphs of the decode buckets, one per key (bucket, execution path, variant: e.g. which aux
// hidden states the step copies out): the first step of a key
// runs its launches eagerly and then captures them; later steps replay the graph (after the step's
// metadata went into the fixed-address buffers the launches read). A failed capture turns graphs
// off for good (eager launches give the same bits) and rethrows.
#pragma once
#include <functional>
#include <map>
#include <tuple>

typedef struct CUstream_st* cudaStream_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

namespace m3::native {

class GraphCache {
 public:
  GraphCache() = default;
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  struct Result {
    bool replayed = false, captured = false;
  };
  // Replays key's graph on stream, or (none yet) runs enqueue() eagerly and then captures it.
  // With graphs off (disabled(), or after a failed capture) enqueue() runs eagerly each time.
  Result run(std::tuple<int, int, int> key, cudaStream_t stream, const std::function<void()>& enqueue);
  void disable() { enabled_ = false; }
  bool enabled() const { return enabled_; }
  void clear();  // destroys every graph (e.g. before what they captured goes away)

 private:
  bool enabled_ = true;
  std::map<std::tuple<int, int, int>, cudaGraphExec_t> graphs_;
};

}  // namespace m3::native
