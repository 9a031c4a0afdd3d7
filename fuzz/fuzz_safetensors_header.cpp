// libFuzzer target: the safetensors header parser on arbitrary bytes (a whole file image).
// Contract: either an m3::Error, or entries whose byte ranges lie inside the input and match their
// shape x dtype size. Any other exception, a sanitizer report or a broken invariant is a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    m3::SafetensorsHeader h = m3::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz-input");
    const uint64_t base = 8 + h.header_len;
    if (base > size || h.data_size != size - base) __builtin_trap();
    volatile uint8_t sink = 0;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_size) __builtin_trap();
      uint64_t n = m3::dtype_size(t.dtype);
      for (auto d : t.shape) {
        if (d < 0) __builtin_trap();
        n *= uint64_t(d);
      }
      if (n != t.nbytes()) __builtin_trap();
      if (t.nbytes()) sink = sink ^ data[base + t.begin] ^ data[base + t.end - 1];  // ASan checks the range ends
    }
    (void)sink;
  } catch (const m3::Error&) {
  }
  return 0;
}
