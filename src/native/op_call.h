// One launch of the forward as data: which op, its params (built and checked by the op's
// make_<op>_params in native/<op>.h), and where it sits in the step (the accounting stage the
// benchmark's spans use, the launch's own name, the model layer). A layer plan (native/layer_plan.h)
// is a list of these; the native path launches each (launch below, through the one launch
// helper), the mono path encodes them as tasks. Plain C++: host code holds plans.
#pragma once
#include <cstdint>
#include <variant>

#include "kernels/attention_params.h"
#include "kernels/embedding_params.h"
#include "kernels/gather_rows_params.h"
#include "kernels/gemv_params.h"
#include "kernels/indexer_params.h"
#include "kernels/mma_params.h"
#include "kernels/moe_params.h"
#include "kernels/mma_rope_params.h"
#include "kernels/qk_norm_rope_params.h"
#include "kernels/rmsnorm_params.h"
#include "kernels/router_params.h"
#include "kernels/work.h"
#include "native/collective.h"
#include "native/launch.h"

namespace m3::native {

enum class OpKind : uint8_t {
  Embed,
  RmsNorm,
  MmaLinear,
  Gemv,
  QkNormRopeCache,
  IndexerScores,
  IndexerTopk,
  AttentionSplit,
  AttentionCombine,
  RouterSelect,
  MoeGroup,
  MoeRoute,
  RouterGemvRoute,  // the router GEMV whose last item routes (decode)
  MmaRope,          // the qkv projection whose last item of each head ropes it (decode)
  MoeDownCombine,   // the experts' down projection whose last item of each row tile combines it (decode)
  MoeSplit,
  MoeMma,
  MoeGemv,
  MoeCombine,
  GatherRows,
  RankReduce,   // tensor parallelism (native/collective.h): host-side collective + the rank sum
  VocabGather,
};
const char* op_kind_name(OpKind k);

using OpParams =
    std::variant<kernels::EmbedParams, kernels::RmsNormParams, kernels::MmaLinearParams, kernels::GemvParams,
                 kernels::QkNormRopeCacheParams, kernels::IndexerParams, kernels::AttentionParams,
                 kernels::RouterSelectParams, kernels::MoeGroupParams, kernels::MoeRouteParams,
                 kernels::MoeSplitParams, kernels::MoeMmaParams, kernels::MoeGemvParams, kernels::MoeCombineParams,
                 kernels::GatherRowsParams, RankReduceParams, VocabGatherParams, kernels::RouterGemvRouteParams,
                 kernels::MmaRopeParams, kernels::MoeDownCombineParams>;

struct OpCall {
  OpKind kind = OpKind::Embed;
  const char* stage = "";  // accounting stage (bench/step_bytes.h): "embed", "norms", "qkv", "rope_cache",
                           // "index_k", "kv", "o", "moe", "dense_mlp", "lm_head"
  const char* name = "";   // this launch: "input_norm", "router", "gate_up", "attention", ...
  int layer = -1;          // model layer, -1 outside the layers
  OpParams params;
};

// The params of op's kind (throws naming the op when kind and params disagree).
template <class P>
const P& op_params(const OpCall& op);
// f(params) with the params type op.kind says.
template <class F>
decltype(auto) with_op_params(const OpCall& op, F&& f);

// The op's WorkShape (kernels/<op>_params.h). Throws if kind and params disagree. The collectives
// (RankReduce, VocabGather) have none of their own: {0 items}.
kernels::WorkShape op_shape(const OpCall& op);
// Launches the op through the launch helper (native/launch.h).
void launch(const OpCall& op, cudaStream_t stream, const LaunchOptions& opt = {});

// ---- the templates above ----
[[noreturn]] void op_params_mismatch(const OpCall& op);

template <class P>
const P& op_params(const OpCall& op) {
  const P* p = std::get_if<P>(&op.params);
  if (!p) op_params_mismatch(op);
  return *p;
}

template <class F>
decltype(auto) with_op_params(const OpCall& op, F&& f) {
  switch (op.kind) {
    case OpKind::Embed: return f(op_params<kernels::EmbedParams>(op));
    case OpKind::RmsNorm: return f(op_params<kernels::RmsNormParams>(op));
    case OpKind::MmaLinear: return f(op_params<kernels::MmaLinearParams>(op));
    case OpKind::Gemv: return f(op_params<kernels::GemvParams>(op));
    case OpKind::QkNormRopeCache: return f(op_params<kernels::QkNormRopeCacheParams>(op));
    case OpKind::IndexerScores:
    case OpKind::IndexerTopk: return f(op_params<kernels::IndexerParams>(op));
    case OpKind::AttentionSplit:
    case OpKind::AttentionCombine: return f(op_params<kernels::AttentionParams>(op));
    case OpKind::RouterSelect: return f(op_params<kernels::RouterSelectParams>(op));
    case OpKind::MoeGroup: return f(op_params<kernels::MoeGroupParams>(op));
    case OpKind::MoeRoute: return f(op_params<kernels::MoeRouteParams>(op));
    case OpKind::RouterGemvRoute: return f(op_params<kernels::RouterGemvRouteParams>(op));
    case OpKind::MmaRope: return f(op_params<kernels::MmaRopeParams>(op));
    case OpKind::MoeDownCombine: return f(op_params<kernels::MoeDownCombineParams>(op));
    case OpKind::MoeSplit: return f(op_params<kernels::MoeSplitParams>(op));
    case OpKind::MoeMma: return f(op_params<kernels::MoeMmaParams>(op));
    case OpKind::MoeGemv: return f(op_params<kernels::MoeGemvParams>(op));
    case OpKind::MoeCombine: return f(op_params<kernels::MoeCombineParams>(op));
    case OpKind::GatherRows: return f(op_params<kernels::GatherRowsParams>(op));
    case OpKind::RankReduce: return f(op_params<RankReduceParams>(op));
    case OpKind::VocabGather: return f(op_params<VocabGatherParams>(op));
  }
  op_params_mismatch(op);
}

}  // namespace m3::native
