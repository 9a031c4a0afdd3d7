// The forward as data: for one step shape (rows, metadata view, context bound), every launch of
// the embedding, of each layer and of the final norm (and, for decode buckets, lm_head), as a list
// of typed op calls (native/op_call.h) whose params were built and checked by the ops' own
// builders. Decode-bucket plans are built once per bucket (their pointers are the fixed buffers a
// captured graph replays); eager passes build theirs per pass. Executing a plan is a loop
// (native/forward.h); the benchmark walks the same list for its per-op spans, and the mono path
// encodes a layer range's ops as tasks.
#pragma once
#include <vector>

#include "native/activations.h"
#include "native/forward_model.h"
#include "native/op_call.h"
#include "native/step_metadata.h"

namespace m3::native {

struct PlanShape {
  int rows = 0;           // token rows of the pass (padding included)
  StepMetadataView meta;  // device metadata; meta.max_context sizes the launches (indexer, attention)
  bool lm_head = false;   // end with lm_head over all rows into Activations::logits (decode buckets)
  // Decode-sized plans may fuse the norms' prep half into the ops before them (fused_norms_enabled);
  // false: every layer starts from its own input norm op (a layer range is self-contained: the
  // library level's layer calls, native/device_layers.h). The same bits either way.
  bool fuse_norms = true;
};

struct LayerPlan {
  PlanShape shape;
  std::vector<OpCall> ops;
  // ops [layer_begin[l], layer_begin[l + 1]) are layer l's; before layer_begin[0] the embedding,
  // from layer_begin[num_layers] the final norm (and lm_head).
  std::vector<int> layer_begin;
  int layer_first_op(int l) const { return layer_begin[size_t(l)]; }
};

// Builds the plan (every op's checks run here: a bad shape fails before anything is launched).
LayerPlan build_layer_plan(const ForwardModel& m, Activations& act, const PlanShape& shape);

// Whether decode-sized plans fuse the norms' prep half into their producers (kernels/
// fused_norm_params.h): on unless M3_FUSED_NORMS=0 (the same bits either way).
bool fused_norms_enabled();
// Overrides it for the plans built from now on (tests): 0 off, 1 on, -1 back to the environment's.
void set_fused_norms(int on);

// Whether sparse layers' attention split items select their top-k blocks themselves from the
// indexer's block scores (one op less a layer; AttentionParams::topk_scores) where the selection
// fits their buffers: on unless M3_FUSED_TOPK=0 (the same bits either way). set_fused_topk
// overrides it for the plans built from now on (0 off, 1 on, -1 back to the environment's).
bool fused_topk_enabled();
void set_fused_topk(int on);

// The residual norm: with add_f, x += f (the last sublayer's output) first; then a = RMSNorm(x)
// * (1 + w) over `rows` rows (the next sublayer's input, or the final norm's output); with prep,
// only the prep half: a = x (1 + w) and act.inv (kernels/fused_norm_params.h).
kernels::RmsNormParams residual_norm_params(const ForwardModel& m, Activations& act, const uint16_t* w, int rows,
                                            bool add_f, bool prep);

}  // namespace m3::native
