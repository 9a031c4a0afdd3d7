// OpCall's names and work shapes (native/op_call.h): plain C++ (the host-side mono encoder and
// the CPU tests use it without CUDA).
#include "core/check.h"
#include "native/op_call.h"

namespace m3::native {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Embed: return "embed";
    case OpKind::RmsNorm: return "rms_norm";
    case OpKind::MmaLinear: return "mma_linear";
    case OpKind::Gemv: return "gemv";
    case OpKind::QkNormRopeCache: return "qk_norm_rope_cache";
    case OpKind::IndexerScores: return "indexer_scores";
    case OpKind::IndexerTopk: return "indexer_topk";
    case OpKind::AttentionSplit: return "attention";
    case OpKind::AttentionCombine: return "attention_combine";
    case OpKind::RouterSelect: return "router_select";
    case OpKind::MoeGroup: return "moe_group";
    case OpKind::MoeRoute: return "moe_route";
    case OpKind::RouterGemvRoute: return "router_gemv_route";
    case OpKind::MmaRope: return "mma_rope";
    case OpKind::MoeDownCombine: return "moe_down_combine";
    case OpKind::MoeSplit: return "moe_split";
    case OpKind::MoeMma: return "moe_mma";
    case OpKind::MoeGemv: return "moe_gemv";
    case OpKind::MoeCombine: return "moe_combine";
    case OpKind::GatherRows: return "gather_rows";
    case OpKind::RankReduce: return "rank_reduce";
    case OpKind::VocabGather: return "vocab_gather";
  }
  return "?";
}

void op_params_mismatch(const OpCall& op) {
  M3_FAIL("op {} ({} of layer {}): its params are not those of a {}", op.name, op.stage, op.layer,
          op_kind_name(op.kind));
}

kernels::WorkShape op_shape(const OpCall& op) {
  using namespace kernels;
  switch (op.kind) {
    case OpKind::IndexerScores: return indexer_scores_shape(op_params<IndexerParams>(op));
    case OpKind::IndexerTopk: return indexer_topk_shape(op_params<IndexerParams>(op));
    case OpKind::AttentionSplit: return attention_split_shape(op_params<AttentionParams>(op));
    case OpKind::AttentionCombine: return attention_combine_shape(op_params<AttentionParams>(op));
    default: break;
  }
  return with_op_params(op, [](const auto& p) -> WorkShape {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_same_v<P, EmbedParams>) return embed_shape(p);
    else if constexpr (std::is_same_v<P, RmsNormParams>) return rmsnorm_shape(p);
    else if constexpr (std::is_same_v<P, MmaLinearParams>) return mma_linear_shape(p);
    else if constexpr (std::is_same_v<P, GemvParams>) return gemv_shape(p);
    else if constexpr (std::is_same_v<P, QkNormRopeCacheParams>) return qk_norm_rope_cache_shape(p);
    else if constexpr (std::is_same_v<P, RouterSelectParams>) return router_select_shape(p);
    else if constexpr (std::is_same_v<P, MoeGroupParams>) return moe_group_shape(p);
    else if constexpr (std::is_same_v<P, MoeRouteParams>) return moe_route_shape(p);
    else if constexpr (std::is_same_v<P, RouterGemvRouteParams>) return router_gemv_route_shape(p);
    else if constexpr (std::is_same_v<P, MmaRopeParams>) return mma_rope_shape(p);
    else if constexpr (std::is_same_v<P, MoeDownCombineParams>) return moe_down_combine_shape(p);
    else if constexpr (std::is_same_v<P, MoeSplitParams>) return moe_split_shape(p);
    else if constexpr (std::is_same_v<P, MoeMmaParams>) return moe_mma_shape(p);
    else if constexpr (std::is_same_v<P, MoeGemvParams>) return moe_gemv_shape(p);
    else if constexpr (std::is_same_v<P, MoeCombineParams>) return moe_combine_shape(p);
    else if constexpr (std::is_same_v<P, GatherRowsParams>) return gather_rows_shape(p);
    else if constexpr (std::is_same_v<P, native::RankReduceParams> || std::is_same_v<P, native::VocabGatherParams>)
      return WorkShape{};
    else M3_FAIL("op_shape: no shape for this op");
  });
}


}  // namespace m3::native
