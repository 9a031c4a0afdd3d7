// OpCall's shape and launch (native/op_call.h): one switch over the op kinds.
#include "native/op_call.h"

#include "core/check.h"
#include "native/attention.h"
#include "native/embed.h"
#include "native/gather_rows.h"
#include "native/indexer.h"
#include "native/linear.h"
#include "native/moe.h"
#include "native/norm.h"
#include "native/qk_norm_rope.h"
#include "native/router.h"

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
    case OpKind::MoeSplit: return "moe_split";
    case OpKind::MoeMma: return "moe_mma";
    case OpKind::MoeGemv: return "moe_gemv";
    case OpKind::MoeCombine: return "moe_combine";
    case OpKind::GatherRows: return "gather_rows";
  }
  return "?";
}

namespace {

template <class P>
const P& params_of(const OpCall& op) {
  const P* p = std::get_if<P>(&op.params);
  M3_CHECK(p != nullptr, "op {} ({} of layer {}): its params are not those of a {}", op.name, op.stage, op.layer,
           op_kind_name(op.kind));
  return *p;
}

// f(params) with the params type the kind says.
template <class F>
decltype(auto) with_params(const OpCall& op, F&& f) {
  switch (op.kind) {
    case OpKind::Embed: return f(params_of<kernels::EmbedParams>(op));
    case OpKind::RmsNorm: return f(params_of<kernels::RmsNormParams>(op));
    case OpKind::MmaLinear: return f(params_of<kernels::MmaLinearParams>(op));
    case OpKind::Gemv: return f(params_of<kernels::GemvParams>(op));
    case OpKind::QkNormRopeCache: return f(params_of<kernels::QkNormRopeCacheParams>(op));
    case OpKind::IndexerScores:
    case OpKind::IndexerTopk: return f(params_of<kernels::IndexerParams>(op));
    case OpKind::AttentionSplit:
    case OpKind::AttentionCombine: return f(params_of<kernels::AttentionParams>(op));
    case OpKind::RouterSelect: return f(params_of<kernels::RouterSelectParams>(op));
    case OpKind::MoeGroup: return f(params_of<kernels::MoeGroupParams>(op));
    case OpKind::MoeRoute: return f(params_of<kernels::MoeRouteParams>(op));
    case OpKind::MoeSplit: return f(params_of<kernels::MoeSplitParams>(op));
    case OpKind::MoeMma: return f(params_of<kernels::MoeMmaParams>(op));
    case OpKind::MoeGemv: return f(params_of<kernels::MoeGemvParams>(op));
    case OpKind::MoeCombine: return f(params_of<kernels::MoeCombineParams>(op));
    case OpKind::GatherRows: return f(params_of<kernels::GatherRowsParams>(op));
  }
  M3_FAIL("op {}: unknown kind {}", op.name, int(op.kind));
}

}  // namespace

kernels::WorkShape op_shape(const OpCall& op) {
  using namespace kernels;
  switch (op.kind) {
    case OpKind::IndexerScores: return indexer_scores_shape(params_of<IndexerParams>(op));
    case OpKind::IndexerTopk: return indexer_topk_shape(params_of<IndexerParams>(op));
    case OpKind::AttentionSplit: return attention_split_shape(params_of<AttentionParams>(op));
    case OpKind::AttentionCombine: return attention_combine_shape(params_of<AttentionParams>(op));
    default: break;
  }
  return with_params(op, [](const auto& p) -> WorkShape {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_same_v<P, EmbedParams>) return embed_shape(p);
    else if constexpr (std::is_same_v<P, RmsNormParams>) return rmsnorm_shape(p);
    else if constexpr (std::is_same_v<P, MmaLinearParams>) return mma_linear_shape(p);
    else if constexpr (std::is_same_v<P, GemvParams>) return gemv_shape(p);
    else if constexpr (std::is_same_v<P, QkNormRopeCacheParams>) return qk_norm_rope_cache_shape(p);
    else if constexpr (std::is_same_v<P, RouterSelectParams>) return router_select_shape(p);
    else if constexpr (std::is_same_v<P, MoeGroupParams>) return moe_group_shape(p);
    else if constexpr (std::is_same_v<P, MoeRouteParams>) return moe_route_shape(p);
    else if constexpr (std::is_same_v<P, MoeSplitParams>) return moe_split_shape(p);
    else if constexpr (std::is_same_v<P, MoeMmaParams>) return moe_mma_shape(p);
    else if constexpr (std::is_same_v<P, MoeGemvParams>) return moe_gemv_shape(p);
    else if constexpr (std::is_same_v<P, MoeCombineParams>) return moe_combine_shape(p);
    else if constexpr (std::is_same_v<P, GatherRowsParams>) return gather_rows_shape(p);
    else M3_FAIL("op_shape: no shape for this op");
  });
}

void launch(const OpCall& op, cudaStream_t stream, const LaunchOptions& opt) {
  switch (op.kind) {
    case OpKind::IndexerScores: return launch_indexer_scores(params_of<kernels::IndexerParams>(op), stream, opt);
    case OpKind::IndexerTopk: return launch_indexer_topk(params_of<kernels::IndexerParams>(op), stream, opt);
    case OpKind::AttentionSplit: return launch_attention_split(params_of<kernels::AttentionParams>(op), stream, opt);
    case OpKind::AttentionCombine:
      return launch_attention_combine(params_of<kernels::AttentionParams>(op), stream, opt);
    default: break;
  }
  with_params(op, [&](const auto& p) {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_same_v<P, kernels::IndexerParams> || std::is_same_v<P, kernels::AttentionParams>)
      M3_FAIL("launch: op {} of kind {} has no launch", op.name, op_kind_name(op.kind));
    else
      launch(p, stream, opt);
  });
}

}  // namespace m3::native
