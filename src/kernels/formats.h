// Element formats the kernels are instantiated for (plain C++: params structs name them).
#pragma once

namespace m3::kernels {

// Row formats of the linear weights: FP8 E4M3 codes with one fp32 scale a row; BF16; F32; MXFP8
// (E4M3 codes with one E8M0 scale per 32 elements of a row: the OCP MX format of the MXFP8 release).
enum class WeightFmt : int { FP8, BF16, F32, MXFP8 };
// E4M3 codes, one byte an element (FP8 and MXFP8)
constexpr bool is_e4m3(WeightFmt w) { return w == WeightFmt::FP8 || w == WeightFmt::MXFP8; }
// Activation formats: bf16; fp32; fp32 handed over already split into bf16 hi / lo
// (kernels/act_split.cuh: the decode tile's input, written so by the op that produces it).
enum class ActFmt : int { BF16, F32, F32Split };
constexpr int act_bytes(ActFmt x) { return x == ActFmt::BF16 ? 2 : 4; }  // bytes an element
constexpr bool act_has_lo(ActFmt x) { return x != ActFmt::BF16; }        // x = hi + lo: two MMAs a step
enum class CacheFmt : int { FP8, BF16 };        // K/V and index-K cache elements

}  // namespace m3::kernels
