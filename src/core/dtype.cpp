#include "core/dtype.h"

#include <array>

namespace m3 {

namespace {
constexpr std::array<DTypeInfo, 14> kTable{{
    {DType::BF16, "BF16", 2},    {DType::F16, "F16", 2},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},      {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::U8, "U8", 1},        {DType::I8, "I8", 1},           {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},      {DType::I64, "I64", 8},         {DType::BOOL, "BOOL", 1},
    {DType::E2M1x2, "E2M1x2", 1}, {DType::E8M0, "E8M0", 1},
}};
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  auto i = static_cast<size_t>(t);
  M3_CHECK(i < kTable.size() && kTable[i].dtype == t, "invalid dtype value {}", i);
  return kTable[i];
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kTable)
    if (e.name == name && e.dtype != DType::E2M1x2 && e.dtype != DType::E8M0) return e.dtype;
  return std::nullopt;
}

}  // namespace m3
