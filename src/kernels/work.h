// How an op's work is cut, as both paths see it (plain C++: host code includes it; device code
// through kernels/group.cuh). An op is a params struct (kernels/<op>_params.h) plus a device
// function of (params, work item, thread group, shared memory) (kernels/<op>.cuh). Its WorkShape
// says how many independent items there are, how many threads run one item (the numerics of
// some ops are fixed to that count: e.g. a fixed-order block reduction over 256 threads), and how
// much shared memory one item needs. The native path maps one CTA to one item (native/launch.cuh);
// the mono path runs items on thread groups of its persistent CTAs. Results never depend on which
// CTA or which warps run an item.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace m3::kernels {

struct WorkShape {
  int64_t items = 0;   // independent work items (0: nothing to do)
  int threads = 0;     // threads that run one item (a multiple of 32)
  int smem_bytes = 0;  // shared memory one item needs (16-byte aligned base)
};

M3_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// w / n and w % n of a work item index w >= 0 (n > 0): 32-bit arithmetic where w fits (a 64-bit
// division is a call of ~70 instructions on the GPU, on the latency path of small ops).
struct ItemSplit {
  int64_t q;
  int r;
};
M3_HOST_DEVICE inline ItemSplit item_split(int64_t w, int n) {
  if (w <= 0x7fffffff) {
    const unsigned u = unsigned(w), d = unsigned(n), q = u / d;
    return {int64_t(q), int(u - q * d)};
  }
  return {w / n, int(w % n)};
}

}  // namespace m3::kernels
