// OpCall's launch (native/op_call.h): one switch over the op kinds.
#include "native/op_call.h"

#include "core/check.h"
#include "native/attention.h"
#include "native/embed.h"
#include "native/gather_rows.h"
#include "native/indexer.h"
#include "native/linear.h"
#include "native/mma_rope.h"
#include "native/moe.h"
#include "native/norm.h"
#include "native/qk_norm_rope.h"
#include "native/router.h"

namespace m3::native {

void launch(const OpCall& op, cudaStream_t stream, const LaunchOptions& opt) {
  switch (op.kind) {
    case OpKind::IndexerScores: return launch_indexer_scores(op_params<kernels::IndexerParams>(op), stream, opt);
    case OpKind::IndexerTopk: return launch_indexer_topk(op_params<kernels::IndexerParams>(op), stream, opt);
    case OpKind::AttentionSplit: return launch_attention_split(op_params<kernels::AttentionParams>(op), stream, opt);
    case OpKind::AttentionCombine:
      return launch_attention_combine(op_params<kernels::AttentionParams>(op), stream, opt);
    default: break;
  }
  with_op_params(op, [&](const auto& p) {
    using P = std::decay_t<decltype(p)>;
    if constexpr (std::is_same_v<P, kernels::IndexerParams> || std::is_same_v<P, kernels::AttentionParams>)
      M3_FAIL("launch: op {} of kind {} has no launch", op.name, op_kind_name(op.kind));
    else
      launch(p, stream, opt);
  });
}

}  // namespace m3::native
