// launch_op<Op>(params, shape, stream): one op's launch through the generic kernel
// (kernels/work_kernel.cuh) and the launch helper (native/launch.h). Included by the native
// launchers (.cu), the only place the generic kernel is instantiated.
#pragma once
#include <cuda_runtime.h>

#include "kernels/work_kernel.cuh"
#include "native/launch.h"

namespace m3::native {

template <class Op>
void launch_op(const typename Op::Params& p, const kernels::WorkShape& shape, cudaStream_t stream, const char* what,
               const LaunchOptions& opt = {}) {
  const void* fn;
  if constexpr (Op::kMaxRegs > 0) fn = reinterpret_cast<const void*>(&kernels::work_kernel_capped<Op>);
  else fn = reinterpret_cast<const void*>(&kernels::work_kernel<Op>);
  int64_t items = shape.items;
  void* args[] = {const_cast<typename Op::Params*>(&p), &items};
  launch_kernel(fn, shape, Op::kMaxThreads, args, stream, what, opt);
}

}  // namespace m3::native
