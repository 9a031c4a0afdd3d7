// The counter-based generator behind seeded sampling, shared bitwise by host and device code (one
// definition: runtime/sampler.cpp and kernels/sampling.cuh both call these).
//   splitmix64(x): the splitmix64 finalizer of x + golden gamma;
//   uniform_draw(seed, i): r = splitmix64(splitmix64(seed) ^ splitmix64(i ^ 0x5851f42d4c957f2d)),
//     u = (r >> 11) * 2^-53, a double in [0, 1). Integer ops and one exact conversion and scaling:
//     the same bits on every machine and on the GPU.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace m3::rng {

M3_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

M3_HOST_DEVICE inline double uniform_draw(uint64_t seed, uint64_t index) {
  // two rounds so that nearby (seed, index) pairs give unrelated streams
  const uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(index ^ 0x5851f42d4c957f2dull));
  return double(r >> 11) * 0x1.0p-53;  // [0, 1)
}

}  // namespace m3::rng
