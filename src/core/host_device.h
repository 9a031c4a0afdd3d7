// M3_HOST_DEVICE: `__host__ __device__` under nvcc, nothing for the host compiler — for the plain
// C++ helpers that host code and kernels share (kernels/*_params.h, core/weight_tiles.h,
// core/counter_rng.h).
#pragma once

#if defined(__CUDACC__)
#define M3_HOST_DEVICE __host__ __device__
#else
#define M3_HOST_DEVICE
#endif
