// Element types used anywhere in the project: one enum, one traits table, one dispatch helper.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/check.h"

namespace m3 {

enum class DType : uint8_t {
  BF16, F16, F32, F64,
  F8_E4M3, F8_E5M2,
  U8, I8, I16, I32, I64, BOOL,
  E2M1x2,  // two FP4 E2M1 values per byte (low nibble = even element); prepared formats only
  E8M0,    // one power-of-two scale per byte; prepared formats only
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // safetensors spelling where one exists
  size_t bytes;           // bytes per stored element (E2M1x2: per pair)
};

const DTypeInfo& dtype_info(DType t);
inline size_t dtype_size(DType t) { return dtype_info(t).bytes; }
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace m3
