// Element formats the kernels are instantiated for (plain C++: params structs name them).
#pragma once

namespace m3::kernels {

enum class WeightFmt : int { FP8, BF16, F32 };  // row formats of the dense (non-MX) weights
enum class ActFmt : int { BF16, F32 };          // activation formats
enum class CacheFmt : int { FP8, BF16 };        // K/V and index-K cache elements

}  // namespace m3::kernels
