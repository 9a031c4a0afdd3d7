// build_layer_plan (native/layer_plan.h): the op list of one pass, in launch order.
#include "native/layer_plan.h"

#include <algorithm>

#include "native/attention.h"
#include "native/collective.h"
#include "native/embed.h"
#include "native/env_switch.h"
#include "native/indexer.h"
#include "native/linear.h"
#include "native/mma_rope.h"
#include "native/moe.h"
#include "native/norm.h"
#include "native/qk_norm_rope.h"

namespace m3::native {

namespace {

// A BF16 (tensor cores) or F32 (GEMV) dense linear over `rows` rows of x.
OpCall dense_linear(const DenseWeight& w, const void* x, int64_t ld_x, int rows, float* y, int64_t ld_y, bool swiglu,
                    float alpha, float limit, const char* stage, const char* name, int layer) {
  const ActIn in{x, DType::F32, ld_x};
  if (w.dtype == DType::F32)
    return OpCall{OpKind::Gemv, stage, name, layer,
                  make_gemv_params(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, in, rows, y, ld_y, swiglu, alpha,
                                   limit)};
  return OpCall{OpKind::MmaLinear, stage, name, layer,
                make_mma_linear_params(w.data, w.dtype, nullptr, w.ld, w.rows, w.cols, in, rows, y, ld_y, swiglu,
                                       alpha, limit)};
}

OpCall fp8_linear(const Fp8Weight& w, const void* x, int64_t ld_x, int rows, float* y, int64_t ld_y,
                  const char* stage, int layer) {
  return OpCall{OpKind::MmaLinear, stage, stage, layer, make_fp8_linear_params(w, ActIn{x, DType::F32, ld_x}, rows, y, ld_y)};
}

// Attention blocks per (token, KV group) at T rows and context ctx: 1 when the workspace cannot
// hold the multi-block mode's chunk states (the same bits either way).
int attention_split_count(const ForwardModel& m, const Activations& act, bool sparse, int T, int ctx) {
  const ModelSpec& s = m.spec();
  const int tiles = attention_max_tiles(sparse, s.index_topk, s.index_block, std::max(ctx, 1));
  const int C = attention_chunks(tiles, m.tiles_per_chunk(sparse));
  const int S = attention_splits(T, s.num_kv_heads, C, m.sms());
  if (S > 1 && attention_workspace_bytes(T, s.num_heads, s.num_kv_heads, s.head_dim, C) > act.attn_ws.bytes()) return 1;
  return S;
}

// The norm's inv for the ops that read the post-attention norm's z (one MoE layer's ops: the
// router GEMV; the split, whose z * inv the tensor-core experts read; or the expert GEMV): nin.ss
// (inv computed by each consumer) only where the consumer can (not the expert GEMV nor a deep
// walk): false, and nothing changed, when one of them cannot.
bool set_norm_in(std::vector<OpCall>& ops, const float* a, const kernels::NormIn& nin) {
  if (nin.ss)
    for (const OpCall& op : ops) {
      const auto* mm = std::get_if<kernels::MmaLinearParams>(&op.params);
      if (op.kind == OpKind::MoeGemv || (mm && mm->x == a && mm->deep)) return false;
    }
  for (OpCall& op : ops) {
    if (auto* g = std::get_if<kernels::GemvParams>(&op.params)) {
      if (g->x == a) g->nin = nin;
    } else if (auto* rg = std::get_if<kernels::RouterGemvRouteParams>(&op.params)) {
      if (rg->gemv.x == a) rg->gemv.nin = nin;
    } else if (auto* mm = std::get_if<kernels::MmaLinearParams>(&op.params)) {
      if (mm->x == a) mm->nin = nin;
    } else if (auto* sp = std::get_if<kernels::MoeSplitParams>(&op.params)) {
      if (sp->x == a) sp->nin = nin;
    } else if (auto* mg = std::get_if<kernels::MoeGemvParams>(&op.params)) {
      if (mg->x == a) mg->nin = nin;
    }
  }
  return true;
}

EnvSwitch g_fused_norms("M3_FUSED_NORMS");
EnvSwitch g_fused_topk("M3_FUSED_TOPK");

}  // namespace

bool fused_norms_enabled() { return g_fused_norms.on(); }

void set_fused_norms(int on) { g_fused_norms.set(on); }

bool fused_topk_enabled() { return g_fused_topk.on(); }

void set_fused_topk(int on) { g_fused_topk.set(on); }

kernels::RmsNormParams residual_norm_params(const ForwardModel& m, Activations& act, const uint16_t* w, int rows,
                                            bool add_f, bool prep) {
  const int H = m.spec().hidden;
  kernels::RmsNormParams n;
  n.n = H;
  n.M = rows;
  n.eps = m.spec().rms_eps;
  n.w = w;
  n.y = act.a.get<float>();
  n.ld_y = H;
  n.x = (add_f ? act.f : act.x).get<float>();
  n.ld_x = H;
  if (add_f) {
    n.residual = act.x.get<float>();
    n.ld_res = H;
    n.residual_out = act.x.get<float>();
    n.ld_res_out = H;
  }
  if (prep) {
    n.prep = 1;
    n.inv = act.inv.get<float>();
  }
  return make_rmsnorm_params(n);
}

LayerPlan build_layer_plan(const ForwardModel& m, Activations& act, const PlanShape& shape) {
  const ModelSpec& s = m.spec();
  const int T = shape.rows, H = s.hidden;
  const StepMetadataView& mv = shape.meta;
  M3_CHECK(T > 0 && T <= act.max_tokens && mv.num_tokens == T,
           "layer plan: {} rows (metadata {}) outside [1, {}] (the activations' rows)", T, mv.num_tokens,
           act.max_tokens);
  LayerPlan plan;
  plan.shape = shape;
  auto& ops = plan.ops;
  auto add = [&](OpKind kind, const char* stage, const char* name, int layer, OpParams p) {
    ops.push_back(OpCall{kind, stage, name, layer, p});
  };

  const DenseWeight E = m.weights().embed();
  kernels::EmbedParams ep;
  ep.table = static_cast<const uint16_t*>(E.data);
  ep.ld = E.ld / 2;
  ep.V = E.rows;
  ep.H = H;
  ep.M = T;
  ep.ids = act.ids.get<int32_t>();
  ep.out = act.x.get<float>();
  ep.ld_out = H;
  add(OpKind::Embed, "embed", "embed", -1, make_embed_params(ep));

  const int S_dense = attention_split_count(m, act, false, T, mv.max_context);
  const int S_sparse = attention_split_count(m, act, true, T, mv.max_context);
  // The norms in two halves (kernels/fused_norm_params.h) wherever the hidden size allows: the input
  // norm of every layer and the post-attention norm of the MoE layers. The prep half is an op
  // (inv written by it), or, in decode-sized plans, fused into the op that produces the residual
  // update (the O projection, the previous layer's MoE combine: chunk sums written, each consumer
  // computes inv); the consumers apply inv (qkv and the router to their outputs, the MoE split to
  // the z it splits for the experts). The same bits either way, so a row's bits do not depend on
  // its batch.
  // Tensor parallelism (m.comm()): the O projection's and the MLP's outputs are this rank's partial
  // sums; a rank reduce (native/collective.h) makes them the ranks' sum before the residual add, so
  // nothing that adds the residual may be fused into those ops (the norms run as their own ops).
  DeviceComm* comm = m.comm();
  auto rank_reduce = [&](int l, const char* stage) {
    if (comm)
      ops.push_back(OpCall{OpKind::RankReduce, stage, "rank_reduce", l,
                           make_rank_reduce_params(comm, act.f.get<float>(), int64_t(T) * H, act.tp_gather.get<float>(),
                                                   act.tp_chunk)});
  };
  const bool halves = H % kernels::kNormChunk == 0;
  const bool fuse = shape.fuse_norms && halves && fused_norms_enabled() && T <= kernels::kFusedNormMaxRows && !comm;
  const kernels::NormIn nin_ss{act.ss.get<float>(), nullptr, H, T, s.rms_eps};
  const kernels::NormIn nin_inv{nullptr, act.inv.get<float>(), H, T, s.rms_eps};
  auto norm_out = [&](const uint16_t* w) {
    kernels::NormOut o;
    o.res = act.x.get<float>();
    o.w = w;
    o.z = act.a.get<float>();
    o.ss = act.ss.get<float>();
    o.ld = H;
    o.n = H;
    return o;
  };
  // The qkv and O projections' decode tiles read a and o split into bf16 hi / lo by their
  // producers (use_split_activations; kernels/act_split.cuh): the input norm's prep op or the
  // previous layer's MoE combine writes act.a_split, the attention op that writes o act.o_split.
  const bool split = T <= act.split_rows && split_activations_enabled();
  bool in_fused = false;  // this layer's input norm was done by the previous layer's MoE combine
  bool a_split = false;   // this layer's input norm writes act.a_split
  for (int l = 0; l < s.num_layers; ++l) {
    plan.layer_begin.push_back(int(ops.size()));
    const LayerViews& Lw = m.layer(l);
    if (!in_fused) {
      add(OpKind::RmsNorm, "norms", "input_norm", l,
          residual_norm_params(m, act, Lw.norms.input, T, /*add_f=*/l > 0, /*prep=*/halves));
      auto& np = std::get<kernels::RmsNormParams>(ops.back().params);
      a_split = split && np.prep;
      if (a_split) np.y_split = act.a_split.get<uint16_t>();
    }
    ops.push_back(fp8_linear(Lw.qkv, act.a.get(), H, T, act.proj.get<float>(), act.proj_ld, "qkv", l));
    auto& qkv = std::get<kernels::MmaLinearParams>(ops.back().params);
    if (halves) qkv.nin = in_fused ? nin_ss : nin_inv;
    if (a_split) use_split_activations(qkv, act.a_split.get());
    in_fused = false;

    QkNormRopeArgs qa = qk_norm_rope_args(s, l);
    qa.proj = act.proj.get<float>();
    qa.proj_stride = act.proj_ld;
    qa.q_norm = Lw.qk_norms[0];
    qa.k_norm = Lw.qk_norms[1];
    qa.iq_norm = Lw.qk_norms[2];
    qa.ik_norm = Lw.qk_norms[3];
    qa.inv_freq = m.rope().inv_freq();
    qa.q_out = act.q.get<float>();
    qa.iq_out = act.iq.get<float>();
    const KvLayerView cv = m.cache().layer(l);
    const kernels::QkNormRopeCacheParams rp = make_qk_norm_rope_params(qa, mv, cv);
    if (mma_rope_enabled() && kernels::mma_rope_fits(qkv, rp) &&
        int64_t(rp.vectors_per_token()) * 4 <= int64_t(act.rope_arrivals.bytes())) {
      // the qkv items of each head rope it as the last one lands (one op less; kernels/mma_rope.cuh);
      // the new op (a copy of qkv's params) is built before it replaces the op qkv refers to
      ops.back() = OpCall{OpKind::MmaRope, "qkv", "qkv", l,
                          make_mma_rope_params(qkv, rp, act.rope_arrivals.get<int32_t>())};
    } else {
      add(OpKind::QkNormRopeCache, "rope_cache", "rope_cache", l, rp);
    }

    int32_t* sel = nullptr;
    const float* topk_scores = nullptr;  // the split items select the blocks (fused_topk_enabled)
    int topk_mqb = 0;
    if (s.sparse(l)) {
      IndexerArgs ia;
      ia.iq = act.iq.get<float>();
      ia.index_heads = s.index_heads;
      ia.index_dim = s.index_dim;
      ia.topk = s.index_topk;
      ia.local = s.index_local;
      ia.workspace = act.idx_ws.get();
      ia.workspace_bytes = act.idx_ws.bytes();
      ia.selected = act.sel.get<int32_t>();
      const kernels::IndexerParams ip = make_indexer_params(ia, mv, cv);
      add(OpKind::IndexerScores, "index_k", "indexer_scores", l, ip);
      topk_scores = fused_topk_enabled() && ip.index_heads == cv.kv_heads &&
                            kernels::attention_topk_fits(cv.head_dim, cv.kv_dtype == DType::F8_E4M3 ? 1 : 2,
                                                         ip.max_q_blocks, ip.topk)
                        ? ip.block_scores
                        : nullptr;
      if (!topk_scores) add(OpKind::IndexerTopk, "index_k", "indexer_topk", l, ip);
      sel = act.sel.get<int32_t>();
      topk_mqb = ip.max_q_blocks;
    }
    AttentionArgs aa;
    aa.q = act.q.get<float>();
    aa.num_heads = s.num_heads;
    aa.selected = sel;
    aa.topk = sel ? s.index_topk : 0;
    aa.topk_scores = topk_scores;
    aa.max_q_blocks = topk_mqb;
    aa.topk_local = s.index_local;
    aa.num_splits = sel ? S_sparse : S_dense;
    aa.tiles_per_chunk = m.tiles_per_chunk(sel != nullptr);
    aa.workspace = act.attn_ws.get();
    aa.workspace_bytes = act.attn_ws.bytes();
    aa.out = act.o.get<float>();
    kernels::AttentionParams ap = make_attention_params(aa, mv, cv);
    if (split) ap.out_split = act.o_split.get<uint16_t>();
    add(OpKind::AttentionSplit, "kv", "attention", l, ap);
    if (ap.num_splits > 1) add(OpKind::AttentionCombine, "kv", "attention_combine", l, ap);
    OpCall o_proj = fp8_linear(Lw.o, act.o.get(), s.q_dim(), T, act.f.get<float>(), H, "o", l);
    if (split) use_split_activations(std::get<kernels::MmaLinearParams>(o_proj.params), act.o_split.get());
    auto post_norm = [&](bool prep) {
      return OpCall{OpKind::RmsNorm, "norms", "post_norm", l,
                    residual_norm_params(m, act, Lw.norms.post, T, /*add_f=*/true, prep)};
    };
    if (s.moe(l)) {
      std::vector<OpCall> moe;
      add_moe_ops(moe, Lw.moe, act.a.get<float>(), H, T, act.f.get<float>(), H, act.moe_ws.get(), act.moe_ws.bytes(),
                  l, act.route_arrivals.get<int32_t>());
      auto& op = std::get<kernels::MmaLinearParams>(o_proj.params);
      const bool post_fused = fuse && !op.deep && !op.swiglu && op.N == H && set_norm_in(moe, act.a.get<float>(), nin_ss);
      if (post_fused) op.nout = norm_out(Lw.norms.post);
      else if (halves) M3_CHECK(set_norm_in(moe, act.a.get<float>(), nin_inv), "layer plan: layer {}: no inv", l);
      ops.push_back(o_proj);
      rank_reduce(l, "o");
      if (!post_fused) ops.push_back(post_norm(halves));
      // the next layer's input norm: done by this combine (its only consumer, the qkv projection,
      // is a wide decode tile at these sizes)
      M3_CHECK(!moe.empty() && moe.back().kind == OpKind::MoeCombine, "layer plan: layer {}'s MoE ops end with {}", l,
               moe.empty() ? "nothing" : moe.back().name);
      if (fuse && l + 1 < s.num_layers) {
        kernels::NormOut& no = std::get<kernels::MoeCombineParams>(moe.back().params).nout;
        no = norm_out(m.layer(l + 1).norms.input);
        if (split) no.zs = act.a_split.get<uint16_t>();
        a_split = split;
        in_fused = true;
      }
      if (T <= kernels::kMoeDownCombineMaxTokens)
        fuse_down_combine(moe, act.combine_arrivals.get<int32_t>(), int64_t(act.combine_arrivals.bytes() / 4));
      ops.insert(ops.end(), moe.begin(), moe.end());
      rank_reduce(l, "moe");
    } else {
      ops.push_back(o_proj);
      rank_reduce(l, "o");
      ops.push_back(post_norm(false));
      const int I = Lw.gate_up.rows / 2;
      M3_CHECK(Lw.gate_up.rows % 2 == 0 && Lw.down.cols == I && Lw.down.rows == Lw.gate_up.cols,
               "dense_mlp: layer {} gate_up [{} x {}] and down [{} x {}] do not match", l, Lw.gate_up.rows,
               Lw.gate_up.cols, Lw.down.rows, Lw.down.cols);
      ops.push_back(dense_linear(Lw.gate_up, act.a.get(), H, T, act.h.get<float>(), act.ld_h, true, s.swiglu_alpha,
                                 s.swiglu_limit, "dense_mlp", "gate_up", l));
      ops.push_back(dense_linear(Lw.down, act.h.get(), act.ld_h, T, act.f.get<float>(), H, false, 0, 0, "dense_mlp",
                                 "down", l));
      rank_reduce(l, "dense_mlp");
    }
  }
  plan.layer_begin.push_back(int(ops.size()));
  add(OpKind::RmsNorm, "lm_head", "final_norm", -1,
      residual_norm_params(m, act, m.weights().final_norm(), T, /*add_f=*/true, /*prep=*/false));
  if (shape.lm_head) {
    M3_CHECK(T <= act.logits_rows, "layer plan: lm_head over {} rows, the logits buffer holds {}", T, act.logits_rows);
    if (!comm) {
      ops.push_back(dense_linear(m.weights().lm_head(), act.a.get(), H, T, act.logits.get<float>(), s.vocab_size,
                                 false, 0, 0, "lm_head", "lm_head", -1));
    } else {  // this rank's vocabulary columns, then every rank's
      const DenseWeight lm = m.weights().lm_head();
      ops.push_back(dense_linear(lm, act.a.get(), H, T, act.logits_local.get<float>(), lm.rows, false, 0, 0, "lm_head",
                                 "lm_head", -1));
      ops.push_back(OpCall{OpKind::VocabGather, "lm_head", "vocab_gather", -1,
                           make_vocab_gather_params(comm, act.logits_local.get<float>(), T, lm.rows,
                                                    act.tp_gather.get<float>(), act.logits.get<float>(),
                                                    s.vocab_size)});
    }
  }
  return plan;
}

}  // namespace m3::native
