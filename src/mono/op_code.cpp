// op_code (mono/op_code.h): which instantiation a plan op's params select.
#include "mono/op_code.h"

#include <fmt/format.h>

namespace m3::mono {

const char* op_code_name(OpCode c) {
  static const char* const names[] = {
      "rms_norm_regs",       "rms_norm_strided",    "mma_decode_fp8_f32",  "mma_stream_fp8_f32",  "mma_decode_fp8_split", "mma_decode_fp8_split_whole", "mma_wide2x2_fp8_f32",  "rope_fp8_fp8",
      "rope_fp8_bf16",       "rope_bf16_fp8",       "rope_bf16_bf16",      "indexer_scores_fp8",  "indexer_scores_bf16", "indexer_topk",
      "attn_split_fp8_d64",  "attn_split_fp8_d128", "attn_split_bf16_d64", "attn_split_bf16_d128", "attn_combine",
      "gemv_f32_m1",         "gemv_f32_m2",         "gemv_f32_m4",         "gemv_bf16_m1",       "gemv_bf16_m2",
      "gemv_bf16_m4",        "gemv_f32_m8",         "gemv_f32_m16",        "gemv_bf16_m8",       "gemv_bf16_m16",        "moe_route",
      "router_route_f32_m1", "router_route_f32_m2", "router_route_f32_m4", "router_route_bf16_m1", "router_route_bf16_m2",
      "router_route_bf16_m4", "moe_split",           "moe_wide_staged3",   "moe_wide_regs",
      "moe_combine",         "mma_rope_split"};
  static_assert(sizeof(names) / sizeof(names[0]) == size_t(OpCode::Count), "one name per code");
  return c < OpCode::Count ? names[size_t(c)] : "?";
}

std::optional<OpCode> op_code(const native::OpCall& op, std::string* why) {
  using native::OpKind;
  using kernels::ActFmt;
  using kernels::CacheFmt;
  using kernels::WeightFmt;
  auto no = [&](std::string s) -> std::optional<OpCode> {
    if (why) *why = fmt::format("layer {} op {} ({}): {}", op.layer, op.name, native::op_kind_name(op.kind), s);
    return std::nullopt;
  };
  switch (op.kind) {
    case OpKind::RmsNorm:
      return std::get<kernels::RmsNormParams>(op.params).regs ? OpCode::RmsNormRegs : OpCode::RmsNormStrided;
    case OpKind::MmaLinear: {
      const auto& p = std::get<kernels::MmaLinearParams>(op.params);
      if (p.wfmt == WeightFmt::FP8 && p.xfmt == ActFmt::F32Split) {
        if (p.deep || p.rt != 1 || p.nt != 1 || p.stream)
          return no("split activations outside the decode tile's register walk");
        return OpCode::MmaDecodeFp8Split;
      }
      if (p.wfmt != WeightFmt::FP8 || p.xfmt != ActFmt::F32)
        return no("mono runs FP8 row-scaled projections over fp32 activations only");
      if (!p.deep && p.rt == 2 && p.nt == 2) return OpCode::MmaWide2x2Fp8F32;
      if (p.deep || p.rt != 1 || p.nt != 1)
        return no(fmt::format("tiling {} x {}{} is not the decode tile nor the 2 x 2 wide one", p.rt, p.nt,
                              p.deep ? " deep" : ""));
      return p.stream ? OpCode::MmaStreamFp8F32 : OpCode::MmaDecodeFp8F32;
    }
    case OpKind::QkNormRopeCache: {
      const auto& p = std::get<kernels::QkNormRopeCacheParams>(op.params);
      const bool kv8 = p.kv_fmt == CacheFmt::FP8, ik8 = p.ik_fmt == CacheFmt::FP8;
      return kv8 ? (ik8 ? OpCode::RopeFp8Fp8 : OpCode::RopeFp8Bf16) : (ik8 ? OpCode::RopeBf16Fp8 : OpCode::RopeBf16Bf16);
    }
    case OpKind::IndexerScores: {
      const auto& p = std::get<kernels::IndexerParams>(op.params);
      if (p.tok_tile != 1) return no(fmt::format("indexer scores over tiles of {} tokens (prefill)", p.tok_tile));
      return p.ik_fmt == CacheFmt::FP8 ? OpCode::IndexerScoresFp8 : OpCode::IndexerScoresBf16;
    }
    case OpKind::IndexerTopk: return OpCode::IndexerTopk;
    case OpKind::AttentionSplit: {
      const auto& p = std::get<kernels::AttentionParams>(op.params);
      if (p.head_dim != 64 && p.head_dim != 128) return no(fmt::format("head_dim {}", p.head_dim));
      const bool d64 = p.head_dim == 64;
      if (p.kv_fmt == CacheFmt::FP8) return d64 ? OpCode::AttnSplitFp8D64 : OpCode::AttnSplitFp8D128;
      return d64 ? OpCode::AttnSplitBf16D64 : OpCode::AttnSplitBf16D128;
    }
    case OpKind::AttentionCombine: return OpCode::AttnCombine;
    case OpKind::Gemv: {
      const auto& p = std::get<kernels::GemvParams>(op.params);
      if (p.xfmt != ActFmt::F32) return no("GEMV over bf16 activations");
      if (p.wfmt != WeightFmt::F32 && p.wfmt != WeightFmt::BF16)
        return no("GEMV of FP8 weights (mono's router is F32 or BF16)");
      if (p.token_groups != 1) return no(fmt::format("GEMV of {} tokens ({} per pass)", p.M, p.mt));
      const bool f32 = p.wfmt == WeightFmt::F32;
      if (p.mt <= 4) {  // the router of up to 4 tokens: one row per item
        if (p.rows != 1 || (p.mt != 1 && p.mt != 2 && p.mt != 4))
          return no(fmt::format("GEMV of {} rows per item at {} tokens per pass (mono runs one)", p.rows, p.mt));
        const int i = p.mt == 1 ? 0 : p.mt == 2 ? 1 : 2;
        return OpCode(int(f32 ? OpCode::GemvF32M1 : OpCode::GemvBf16M1) + i);
      }
      if ((p.mt != 8 && p.mt != 16) || p.rows != kernels::gemv_rows_per_item(p.mt))
        return no(fmt::format("GEMV of {} rows per item at {} tokens per pass", p.rows, p.mt));
      if (p.mt == 8) return f32 ? OpCode::GemvF32M8 : OpCode::GemvBf16M8;
      return f32 ? OpCode::GemvF32M16 : OpCode::GemvBf16M16;
    }
    case OpKind::MoeRoute: return OpCode::MoeRoute;
    case OpKind::RouterGemvRoute: {
      const auto& p = std::get<kernels::RouterGemvRouteParams>(op.params);
      if (!kernels::router_gemv_route_fits(p.gemv, p.route) || (p.gemv.mt != 1 && p.gemv.mt != 2 && p.gemv.mt != 4))
        return no(fmt::format("a fused router of {} tokens ({} per pass, {} rows per item)", p.gemv.M, p.gemv.mt,
                              p.gemv.rows));
      const int i = p.gemv.mt == 1 ? 0 : p.gemv.mt == 2 ? 1 : 2;
      return OpCode(int(p.gemv.wfmt == WeightFmt::F32 ? OpCode::RouterRouteF32M1 : OpCode::RouterRouteBf16M1) + i);
    }
    case OpKind::MmaRope: {
      const auto& p = std::get<kernels::MmaRopeParams>(op.params);
      if (!kernels::mma_rope_fits(p.mma, p.rope)) return no("a fused qkv projection outside the split decode tile");
      return OpCode::MmaRopeSplit;
    }
    case OpKind::MoeSplit: return OpCode::MoeSplit;
    case OpKind::MoeMma: {
      const auto& p = std::get<kernels::MoeMmaParams>(op.params);
      if (p.deep) return no("the deep (prefill) expert walk");
      if (p.fp8) return no("MXFP8 experts (the mono kernel walks MXFP4 experts)");
      if (p.stages == 3) return OpCode::MoeWideStaged3;
      if (p.stages == 0) return OpCode::MoeWideRegs;
      return no(fmt::format("{} stages", p.stages));
    }
    case OpKind::MoeCombine: return OpCode::MoeCombine;
    case OpKind::MoeDownCombine: return no("the fused down projection (build_task_table runs it as its two ops)");
    default: return no("not a decode op of a sparse MoE layer");
  }
}

}  // namespace m3::mono
