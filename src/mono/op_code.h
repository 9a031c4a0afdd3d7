// The ops the mono kernel runs (the decode-bucket ops of a sparse MoE layer), one code per
// instantiation of a native op struct (kernels/<op>.cuh), so the persistent kernel's switch
// (mono/kernel.cu) and the host encoder (op_code.cpp) name the same set. An op of the plan with
// no code here is a refusal naming the op.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "native/op_call.h"

namespace m3::mono {

enum class OpCode : uint8_t {
  RmsNormRegs,
  RmsNormStrided,
  MmaDecodeFp8F32,  // the wide 1 x 1 tile, FP8 weights, fp32 activations (every M <= 8), any norm mode
  MmaStreamFp8F32,  // the same tile, its weights copied to shared memory first (kernels/mma_stream.cuh)
  MmaDecodeFp8Split,  // the decode tile over activations split by their producer (kernels/act_split.cuh)
  MmaDecodeFp8SplitWhole,  // the same, whole items on 4 register groups of 1 block (option fp8_whole)
  MmaWide2x2Fp8F32,  // the 2 x 2 wide tile (9 .. 64 tokens: verify steps of 3-4 rows x 3-4 tokens)
  RopeFp8Fp8,       // K/V cache format, index-K cache format
  RopeFp8Bf16,
  RopeBf16Fp8,
  RopeBf16Bf16,
  IndexerScoresFp8,
  IndexerScoresBf16,
  IndexerTopk,
  AttnSplitFp8D64,
  AttnSplitFp8D128,
  AttnSplitBf16D64,
  AttnSplitBf16D128,
  AttnCombine,
  GemvF32M1,  // the router: F32 or BF16 weights, fp32 activations, 1 / 2 / 4 tokens per pass, one row per item
  GemvF32M2,
  GemvF32M4,
  GemvBf16M1,
  GemvBf16M2,
  GemvBf16M4,
  GemvF32M8,  // 8 / 16 tokens per pass, two rows per item (verify steps of more than 4 tokens)
  GemvF32M16,
  GemvBf16M8,
  GemvBf16M16,
  MoeRoute,
  RouterRouteF32M1,  // the router GEMV whose last item routes (1 / 2 / 4 tokens; native RouterGemvRouteOp)
  RouterRouteF32M2,
  RouterRouteF32M4,
  RouterRouteBf16M1,
  RouterRouteBf16M2,
  RouterRouteBf16M4,
  MoeSplit,
  MoeWideStaged3,
  MoeWideRegs,
  MoeCombine,
  // (appended: the placement's pin puts op codes 8 CTAs apart, so a code inserted above moves the
  // CTAs of every code after it)
  MmaRopeSplit,  // the split decode tile whose last item of each head ropes it (native MmaRopeOp)
  Count
};

const char* op_code_name(OpCode c);

// The code of a plan op, or nullopt with *why set (what mono does not run).
std::optional<OpCode> op_code(const native::OpCall& op, std::string* why);

}  // namespace m3::mono
