// The device buffers of one forward pass of up to max_tokens rows, allocated once (so plans built
// over them keep fixed pointers and captured graphs read new values in place). The residual stream:
// x holds it, f the last sublayer's output (added into x by the next norm), a the normed input of
// the next sublayer.
#pragma once
#include <cstdint>

#include "native/dev_buf.h"
#include "native/forward_model.h"

namespace m3::native {

struct Activations {
  Activations(const ForwardModel& m, int max_tokens, int logits_rows);

  int max_tokens = 0, logits_rows = 0;
  int64_t proj_ld = 0;  // floats per row of proj (the widest fused projection, rounded to 4)
  int64_t ld_h = 0;     // floats per row of h (dense MLP intermediate)
  DevBuf x, f, a;       // [T][hidden] fp32
  DevBuf ss, inv;       // [T][hidden / 16] chunk sums and [T] inv of the norms' halves (kernels/fused_norm_params.h)
  DevBuf proj;          // [T][proj_ld] fused q|k|v|iq|ik projection rows
  DevBuf q, o;          // [T][q_dim] normed + rotated q, attention output
  DevBuf iq;            // [T][index_heads * index_dim] normed + rotated index q
  DevBuf ids, rows;     // [T] token ids, output rows (int32)
  DevBuf gather;        // [min(T, logits_rows)][hidden] output rows before lm_head
  DevBuf logits;        // [logits_rows][vocab] fp32
  DevBuf h;             // [T][ld_h] dense MLP intermediate (models with dense layers)
  DevBuf moe_ws;        // the MoE workspace of T rows (native/moe.h)
  DevBuf idx_ws, sel;   // indexer block scores; selected blocks [T][kv_heads][topk]
  DevBuf attn_ws;       // attention chunk states (the multi-block mode)
  // [1] int32: the fused router GEMV's arrivals (kernels/router_gemv_route.cuh), 0 between launches;
  // reset_counters() zeroes it again after a step that may have stopped inside that op (a mono fault)
  DevBuf route_arrivals;
  // [num_heads + 2 kv_heads + index_heads + 1] int32: the fused qkv projection's arrivals per
  // vector (kernels/mma_rope.cuh), 0 between launches; reset_counters() zeroes them too
  DevBuf rope_arrivals;
  // [ceil(hidden / 32)] int32: the fused down projection's arrivals per row tile
  // (kernels/moe_down_combine.cuh), 0 between launches; reset_counters() zeroes them too
  DevBuf combine_arrivals;
  void reset_counters(cudaStream_t stream) const;
  // a and o split into bf16 hi / lo by their producers for the FP8 decode tiles that read them (the
  // qkv and O projections; kernels/act_split.cuh: [split_rows][2 hidden], [split_rows][2 q_dim]
  // bf16), for plans of up to split_rows = min(max_tokens, kMmaDecodeRows) rows
  int split_rows = 0;
  DevBuf a_split, o_split;
  // tensor parallelism (m.comm(): native/collective.h)
  int64_t tp_chunk = 0;   // floats a rank per all-gather of the rank reduce
  DevBuf tp_gather;       // [ranks][max(tp_chunk, logits_rows * vocab_rows)] the gathered partials / logits
  DevBuf logits_local;    // [logits_rows][vocab_rows] this rank's lm_head columns
};

}  // namespace m3::native
