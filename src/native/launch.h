// The one launch helper of the native path (plain C++ part; the template that names the generic
// kernel is native/launch.cuh). Every native launch goes through launch_kernel(): the grid from
// the op's WorkShape (one CTA per work item, at most 2^31 - 1 CTAs: items past that loop), the
// dynamic shared-memory attribute set once per (device, kernel), programmatic dependent launch
// when asked, the launch check naming the op, and the M3_SYNC_LAUNCHES debug switch
// (native/cuda_check.h) that synchronizes after each launch.
#pragma once
#include <cstdint>

#include "kernels/work.h"

typedef struct CUstream_st* cudaStream_t;

namespace m3::native {

struct LaunchOptions {
  // Programmatic dependent launch: the kernel may start while its predecessor on the stream is
  // finishing; it waits for the predecessor's memory before its first item (work_kernel.cuh).
  bool pdl = false;
};

// The process default for the backends' and the bench's LaunchOptions::pdl: on, M3_PDL=0 in the
// environment turns it off (LaunchOptions' own default stays off, for single launches).
bool pdl_default();

// kernel: a work_kernel instantiation; args: its parameters (params, items); max_threads: the
// kernel's launch bound. `what` names the op in errors. Nothing is launched for 0 items.
void launch_kernel(const void* kernel, const kernels::WorkShape& shape, int max_threads, void** args,
                   cudaStream_t stream, const char* what, const LaunchOptions& opt);

}  // namespace m3::native
