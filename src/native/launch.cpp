// launch_kernel (native/launch.h).
#include "native/launch.h"

#include <cuda_runtime.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "native/cuda_check.h"
#include "native/env_switch.h"

namespace m3::native {

namespace {
// On since 2026-12-07 (H100, 60 layers of one TP-4 rank: native b=1 -73 us, b=4 -54; the GPU
// suite's backend, mono, model, TP and layer-range tests and GpuBitsDump under it: docs/perf.md).
EnvSwitch g_pdl("M3_PDL", true);
}  // namespace

bool pdl_default() { return g_pdl.on(); }

void launch_kernel(const void* kernel, const kernels::WorkShape& shape, int max_threads, void** args,
                   cudaStream_t stream, const char* what, const LaunchOptions& opt) {
  M3_CHECK(shape.items >= 0, "{}: {} work items", what, shape.items);
  if (shape.items == 0) return;
  M3_CHECK(shape.threads > 0 && shape.threads % 32 == 0 && shape.threads <= max_threads,
           "{}: {} threads per item (a multiple of 32, at most the kernel's {})", what, shape.threads, max_threads);
  M3_CHECK(shape.smem_bytes >= 0, "{}: {} bytes of shared memory", what, shape.smem_bytes);
  allow_dynamic_smem(kernel, size_t(shape.smem_bytes));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(shape.items < INT_MAX ? shape.items : INT_MAX));
  cfg.blockDim = dim3(unsigned(shape.threads));
  cfg.dynamicSmemBytes = size_t(shape.smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (opt.pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args);
  M3_CHECK(e == cudaSuccess, "{}: launch of {} items x {} threads ({} B shared memory) failed: {}", what, shape.items,
           shape.threads, shape.smem_bytes, cudaGetErrorString(e));
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
