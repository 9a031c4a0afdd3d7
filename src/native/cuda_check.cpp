#include "native/cuda_check.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace m3 {
bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("M3_SYNC_LAUNCHES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

namespace native {
int device_sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  int dev = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  M3_CHECK(dev >= 0 && dev < int(cache.size()), "device {} out of range", dev);
  int n = cache[size_t(dev)].load(std::memory_order_relaxed);
  if (n == 0) {
    M3_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[size_t(dev)].store(n, std::memory_order_relaxed);
  }
  return n;
}

void allow_dynamic_smem(const void* kernel, size_t bytes) {
  constexpr size_t kDefault = 48 * 1024;
  if (bytes <= kDefault) return;
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> limit;  // (device, kernel) -> bytes set
  int dev = 0;
  M3_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard lk(mu);
  size_t& have = limit[{dev, kernel}];
  if (bytes <= have) return;
  M3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  have = bytes;
}
}  // namespace native
}  // namespace m3
