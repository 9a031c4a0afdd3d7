// Device probes of the benchmark harness (probes.cu): a plain streaming read of a list of byte
// segments in ONE launch (the "plain read" every kernel and step is compared against), random
// fills of device memory in the prepared formats, and an empty kernel (kernel-boundary cost).
// Plain C++ header: host code that includes fmt can use it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace m3::bench {

struct ReadSeg {  // [p, p + bytes): p 16-byte aligned; bytes rounded up to 16 by the reader
  const void* p = nullptr;
  uint64_t bytes = 0;
};

// A reusable set of segment lists at fixed device addresses (so a captured graph replays them).
// add() uploads a list and returns its handle; read() enqueues one launch that streams every
// byte of that list (16-byte non-allocating loads, several in flight per thread).
class SegmentReader {
 public:
  SegmentReader();
  ~SegmentReader();
  SegmentReader(const SegmentReader&) = delete;
  SegmentReader& operator=(const SegmentReader&) = delete;
  int add(const std::vector<ReadSeg>& segs);  // synchronous upload; empty lists are allowed
  void read(int list, cudaStream_t s) const;
  uint64_t bytes(int list) const { return lists_[size_t(list)].bytes; }
  void clear();  // frees every list

 private:
  struct List {
    void* dev = nullptr;  // ReadSeg[n] then uint64_t prefix[n + 1] (16-byte chunks)
    int n = 0;
    uint64_t chunks = 0, bytes = 0;
  };
  std::vector<List> lists_;
  uint32_t* sink_ = nullptr;  // keeps the loads alive
  int sms_ = 0;
};

enum class FillFormat : int {
  Bytes,     // any byte (E2M1 pairs)
  Fp8,       // E4M3 codes without the NaN codes 0x7f / 0xff
  E8M0,      // bytes in [lo, hi]
  Bf16,      // uniform in [lo, hi] as bf16
  F32,       // uniform in [lo, hi]
};
// Fills rows x used bytes of a [rows][row_bytes] tensor at p (the rest of each row is left
// alone), values a hash of (seed, byte index). lo / hi: the range of E8M0 / Bf16 / F32.
void fill_random(void* p, int64_t rows, int64_t row_bytes, int64_t used, FillFormat f, float lo, float hi,
                 uint64_t seed, cudaStream_t s);

// One launch of an empty kernel (<<<1, 32>>>).
void launch_empty(cudaStream_t s);

}  // namespace m3::bench
