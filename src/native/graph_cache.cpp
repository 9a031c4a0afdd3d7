// GraphCache (native/graph_cache.h).
#include "native/graph_cache.h"

#include <cuda_runtime.h>

#include "native/cuda_check.h"

namespace m3::native {

GraphCache::~GraphCache() { clear(); }

void GraphCache::clear() {
  for (auto& [k, g] : graphs_)
    if (g) cudaGraphExecDestroy(g);
  graphs_.clear();
}

GraphCache::Result GraphCache::run(std::tuple<int, int, int> key, cudaStream_t stream, const std::function<void()>& enqueue) {
  Result r;
  if (enabled_) {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      M3_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
      r.replayed = true;
      return r;
    }
  }
  enqueue();
  if (!enabled_) return r;
  cudaGraph_t graph = nullptr;
  M3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    enabled_ = false;
    throw;
  }
  M3_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    enabled_ = false;
    M3_FAIL("cuda backend: instantiating the decode graph of bucket {} (path {}) failed: {}", std::get<0>(key), std::get<1>(key),
            cudaGetErrorString(e));
  }
  graphs_[key] = exec;
  r.captured = true;
  return r;
}

}  // namespace m3::native
