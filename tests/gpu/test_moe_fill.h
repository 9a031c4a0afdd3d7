// Device random fills for large test tensors (test_moe_fill.cu): bytes are a hash of (seed, index).
#pragma once
#include <cstddef>
#include <cstdint>

namespace m3::test {
enum class FillKind { Bytes, Fp8NoNan, E8M0Range };
// kind E8M0Range: bytes uniform in [lo, hi]; Fp8NoNan: no 0x7f / 0xff codes.
void fill_random_device(uint8_t* p, size_t n, uint64_t seed, FillKind kind, int lo = 0, int hi = 255);
// A plain streaming read of `bytes` (16-byte loads, 4 in flight per thread, 1056 blocks of 512)
// on the default stream; sink: 1056 words (written only to keep the loads alive). No sync.
void stream_read_device(const void* p, size_t bytes, uint32_t* sink);
}  // namespace m3::test
