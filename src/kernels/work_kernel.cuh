// The one generic kernel of the native path: CTA b runs work items b, b + gridDim.x, ... of an op
// (normally one: the launch helper sizes the grid to the items), as the whole-CTA group. An op is
// a struct
//   struct SomeOp : OpBounds<MaxThreads, MinBlocks, MaxRegs> {
//     using Params = ...;   // kernels/<op>_params.h
//     __device__ static void run(const Params&, int64_t item, Group g, uint8_t* smem);
//   };
// Its launch bounds come from OpBounds: MaxThreads (>= the threads of any shape of the op),
// MinBlocks (resident CTAs per SM to plan registers for; 0: none) or, when MaxRegs > 0, a register
// cap instead (__maxnreg__). blockIdx / gridDim / blockDim appear here and in group.cuh only.
// Launched with programmatic dependent launch, the kernel waits for its predecessor's memory
// before any item runs (griddepcontrol.wait is a no-op otherwise).
#pragma once
#include <cstdint>

#include "kernels/group.cuh"

namespace m3::kernels {

template <int MaxThreads, int MinBlocks = 0, int MaxRegs = 0>
struct OpBounds {
  static constexpr int kMaxThreads = MaxThreads;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kMaxRegs = MaxRegs;
};

__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <class Op>
__device__ __forceinline__ void run_items(const typename Op::Params& p, int64_t items) {
  extern __shared__ __align__(16) uint8_t work_smem[];
  griddep_wait();
  const Group g = cta_group();
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) Op::run(p, w, g, work_smem);
}

template <class Op>
__global__ void __launch_bounds__(Op::kMaxThreads, Op::kMinBlocks)
    work_kernel(const __grid_constant__ typename Op::Params p, int64_t items) {
  run_items<Op>(p, items);
}

template <class Op>
__global__ void __maxnreg__(Op::kMaxRegs) work_kernel_capped(const __grid_constant__ typename Op::Params p,
                                                             int64_t items) {
  run_items<Op>(p, items);
}

}  // namespace m3::kernels
