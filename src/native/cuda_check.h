// CUDA status checks routed through the project's one checker (core/check.h). M3_CUDA_CHECK for
// runtime calls; M3_LAUNCH_CHECK after each launch (set M3_SYNC_LAUNCHES=1 to synchronize after
// every launch so an asynchronous fault is reported at the launch that caused it).
#pragma once
#include <cuda_runtime.h>

#include "core/check.h"

namespace m3 {
bool sync_after_launch();  // reads M3_SYNC_LAUNCHES once
namespace native {
// Multiprocessor count of the current device (read once per device, then cached). Kernel shapes
// that fix a reduction order (split counts, chains) depend on it and on the problem shape only.
int device_sm_count();
// Lets `kernel` be launched with `bytes` of dynamic shared memory on the current device: raises
// its limit (cudaFuncAttributeMaxDynamicSharedMemorySize) when bytes exceed the default 48 KB and
// what was set for it on this device before. The limit is per device, so a process driving
// several GPUs sets it on each. Not a stream operation: safe while a graph is being captured.
void allow_dynamic_smem(const void* kernel, size_t bytes);
}  // namespace native
}  // namespace m3

// A failed call's error is also taken off the thread's last-error state, so the launch check of
// the next (unrelated) launch does not report it again.
#define M3_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    cudaError_t _e = (expr);                                                                   \
    if (_e != cudaSuccess) (void)cudaGetLastError();                                           \
    M3_CHECK(_e == cudaSuccess, "CUDA error {} ({}) in {}", int(_e), cudaGetErrorString(_e), #expr); \
  } while (0)

#define M3_LAUNCH_CHECK(stream)                                                                \
  do {                                                                                         \
    M3_CUDA_CHECK(cudaGetLastError());                                                         \
    if (::m3::sync_after_launch()) M3_CUDA_CHECK(cudaStreamSynchronize(stream));               \
  } while (0)
