// The prepared arena (model/prepare.h) as named tensors, for code that BORROWS them from a host
// framework instead of loading them (issue 16: the Python module's LayerSpec, a framework that
// loaded the weights itself and hands their buffers over): each tensor's name, storage type and
// shape exactly as the arena stores it (rows padded to 16 bytes, FP8 projection codes in 16-row
// tiles, stacked expert slots), and the check that a borrowed buffer has that layout. Nothing is
// ever converted or copied: a buffer that does not match is refused with the reason.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/prepare.h"

namespace m3 {

// Storage element types a borrowed buffer may declare (DLPack's codes, without the lanes).
enum class ElemKind : uint8_t { UInt, Int, Float, BFloat, Float8E4M3 };

struct TensorSpec {
  std::string name;            // "qkv.codes", "w13.scales", "input_norm", ... (model tensors: "embed", ...)
  DType dtype = DType::U8;     // what the bytes hold (model/prepare.h)
  int elem_bytes = 1;          // bytes of one stored element of the shape below
  std::vector<int64_t> shape;  // stored elements: [slots,] rows, row elements (padded rows included)
  uint64_t offset = 0, bytes = 0;  // where the arena keeps it (its own copy: offset from the arena start)
  std::string describe() const;    // "qkv.codes: F8_E4M3 as uint8 [1024, 256]"
};

// One layer's tensors (only those the layer has), in a fixed order; the model's embedding,
// lm_head and final norm.
std::vector<TensorSpec> layer_tensor_specs(const PreparedLayout& layout, int layer);
std::vector<TensorSpec> model_tensor_specs(const PreparedLayout& layout);

// A buffer as a framework describes it (DLPack): element type and bits, shape and strides in
// elements, where it lives.
struct BorrowedTensor {
  const void* data = nullptr;
  ElemKind kind = ElemKind::UInt;
  int bits = 8;
  std::vector<int64_t> shape, strides;  // strides empty: compact row-major
  bool on_cpu = true;                   // false: a device buffer
  int device = -1;                      // the device's index when not on the CPU
};

// "" when t holds spec's layout: the element type (the stored type, or an unsigned integer of its
// width for the codes and bf16 words: a reinterpretation of the same bytes), the shape, compact
// row-major strides, 16-byte alignment, and the device (want_cpu: the CPU reference; else a GPU);
// else what is wrong, naming the tensor.
std::string check_borrowed(const TensorSpec& spec, const BorrowedTensor& t, bool want_cpu);

}  // namespace m3
