// Element formats the kernels are instantiated for (plain C++: params structs name them).
#pragma once

namespace m3::kernels {

enum class WeightFmt : int { FP8, BF16, F32 };  // row formats of the dense (non-MX) weights
enum class ActFmt : int { BF16, F32 };          // activation formats
enum class CacheFmt : int { FP8, BF16 };        // K/V and index-K cache elements

// EXPERIMENT: decode-walk variants of the tensor-core kernels (params.xflags; the builders read
// M3_KX from the environment). Timing only: kXSplitAcc changes the summation order.
constexpr int kXPrefetchAct = 1;  // L1 prefetch of the chain's activation range at chain start
constexpr int kXSplitAcc = 2;     // hi and lo MMAs into two accumulators, added per block
constexpr int kXPipe = 4;         // FP8 decode: two register groups of 2 blocks, one in flight
constexpr int kXNoRing = 8;       // native MoE wide: the register path instead of the cp.async ring

}  // namespace m3::kernels
