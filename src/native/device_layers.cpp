// DeviceLayers (native/device_layers.h).
#include "native/device_layers.h"

#include <algorithm>

#include "native/collective.h"
#include "native/cuda_check.h"
#include "native/gather_rows.h"
#include "native/linear.h"
#include "native/step_metadata.h"

namespace m3::native {

namespace {
ForwardOptions layers_options(int max_tokens, int max_model_len, DeviceComm* comm) {
  M3_CHECK(max_tokens > 0, "NativeLayers: max_tokens {} (> 0)", max_tokens);
  M3_CHECK(max_model_len > 0, "NativeLayers: max_model_len {} (> 0)", max_model_len);
  ForwardOptions o;
  o.max_tokens = max_tokens;
  o.max_model_len = max_model_len;
  o.logits_rows = std::min(max_tokens, 256);
  o.comm = comm;
  return o;
}
}  // namespace

DeviceLayers::DeviceLayers(std::shared_ptr<const PreparedWeights> weights, std::unique_ptr<DeviceKvCache> cache,
                           int max_tokens, int max_model_len, std::shared_ptr<DeviceComm> comm)
    : comm_(std::move(comm)), cache_(std::move(cache)) {
  M3_CHECK(weights && cache_, "NativeLayers: no weights or no caches");
  fw_ = std::make_unique<Forward>(std::move(weights), *cache_, layers_options(max_tokens, max_model_len, comm_.get()));
}

void DeviceLayers::set_runner(std::unique_ptr<LayerRangeRunner> runner) {
  M3_CHECK(!runner_, "NativeLayers: a layer range runner is already set");
  runner_ = std::move(runner);
}

const char* DeviceLayers::who() const { return runner_ ? "Mono" : "NativeLayers"; }

const LayerPlan& DeviceLayers::plan(const char* what) const {
  M3_CHECK(plan_ != nullptr, "{}.{}: no step prepared (call prepare_step first)", who(), what);
  return *plan_;
}

void DeviceLayers::prepare_step(const StepBatch& batch, cudaStream_t stream) {
  const ModelSpec& s = spec();
  M3_CHECK(!batch.seqs.empty(), "{}.prepare_step: no sequences", who());
  std::vector<int32_t> ids, out;
  bool fixed = true;
  for (const SeqStep& q : batch.seqs) {
    M3_CHECK(!q.tokens.empty(), "{}.prepare_step: sequence {} has no tokens", who(), &q - batch.seqs.data());
    fixed = fixed && int(q.tokens.size()) <= kFixedQueryLen;
    for (size_t j = 0; j < q.tokens.size(); ++j) {
      const int32_t t = q.tokens[j];
      M3_CHECK(t >= 0 && t < s.vocab_size, "{}.prepare_step: sequence {}: token {} outside [0, {})", who(),
               &q - batch.seqs.data(), t, s.vocab_size);
      if (q.all_logits || j + 1 == q.tokens.size()) out.push_back(int32_t(ids.size()));
      ids.push_back(t);
    }
  }
  if (runner_) {  // first: what mono serves says more than the row count
    const std::string why = runner_->refusal(batch);
    M3_CHECK(why.empty(), "Mono.prepare_step: mono does not run this step ({}): it runs decode steps of at most {} "
             "sequences of 1 .. {} query tokens each, all of one length (NativeLayers runs any step)", why,
             kFixedQueryLen, kFixedQueryLen);
  }
  M3_CHECK(int(ids.size()) <= fw_->options().max_tokens, "{}.prepare_step: {} tokens in one step, at most {} (max_tokens)",
           who(), ids.size(), fw_->options().max_tokens);
  StepMetadata m = build_step_metadata(batch, s.index_block, cache_->shape().num_blocks);
  M3_CHECK(m.max_context <= fw_->options().max_model_len,
           "{}.prepare_step: a sequence reaches {} tokens, max_model_len is {}", who(), m.max_context,
           fw_->options().max_model_len);
  if (fixed) widen_block_tables(m, fw_->table_width());
  plan_ = nullptr;
  fw_->upload(m, ids, stream);
  const int T = m.num_tokens;
  if (fixed) {
    std::unique_ptr<LayerPlan>& p = fixed_[T];
    if (!p) {
      // each layer from its own input norm: a range is self-contained
      PlanShape shape{T, fw_->bucket_view(T), false, false};
      p = std::make_unique<LayerPlan>(build_layer_plan(fw_->model(), fw_->act(), shape));
    }
    plan_ = p.get();
  } else {
    pass_ = std::make_unique<LayerPlan>(build_layer_plan(fw_->model(), fw_->act(), PlanShape{T, fw_->view(), false, false}));
    plan_ = pass_.get();
  }
  out_rows_ = std::move(out);
  Activations& act = fw_->act();
  M3_CUDA_CHECK(cudaMemcpyAsync(act.rows.get(), out_rows_.data(), out_rows_.size() * 4, cudaMemcpyHostToDevice, stream));
  M3_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host arrays above are this function's
  if (runner_) {  // the previous step's launches completed (the sync above): did they?
    const std::string err = runner_->take_error();
    M3_CHECK(err.empty(), "Mono: the previous step failed ({}); its outputs are not valid and this Mono is broken",
             err);
  }
}

void DeviceLayers::embed(float* x, cudaStream_t stream) {
  const LayerPlan& p = plan("embed");
  M3_CHECK(x, "{}.embed: no output", who());
  fw_->run_ops(p, 0, p.layer_first_op(0), stream);
  Activations& act = fw_->act();
  M3_CUDA_CHECK(cudaMemcpyAsync(x, act.x.get(), size_t(p.shape.rows) * size_t(spec().hidden) * 4,
                                cudaMemcpyDeviceToDevice, stream));
}

// The residual stream x in act.x, no pending sublayer output (act.f = 0: the input norm that adds
// it adds zeros, x + 0 = x).
void DeviceLayers::load_x(const float* x, cudaStream_t stream) {
  M3_CHECK(x, "{}: no residual stream", who());
  Activations& act = fw_->act();
  const size_t bytes = size_t(plan_->shape.rows) * size_t(spec().hidden) * 4;
  M3_CUDA_CHECK(cudaMemcpyAsync(act.x.get(), x, bytes, cudaMemcpyDeviceToDevice, stream));
  M3_CUDA_CHECK(cudaMemsetAsync(act.f.get(), 0, bytes, stream));
}

// Layers [first, last) of p: the runner's part of the sparse range, native ops for the rest.
void DeviceLayers::run_range(const LayerPlan& p, int first, int last, cudaStream_t stream) {
  const LayerRange sparse = fw_->model().sparse_range();
  const int a = runner_ ? std::clamp(sparse.first, first, last) : last;
  const int b = runner_ ? std::clamp(sparse.last, a, last) : last;
  fw_->run_ops(p, p.layer_first_op(first), p.layer_first_op(a), stream);
  if (a < b) runner_->run_layers(p, LayerRange{a, b}, stream);
  fw_->run_ops(p, p.layer_first_op(b), p.layer_first_op(last), stream);
}

void DeviceLayers::forward_layers(int first, int last, float* x, cudaStream_t stream) {
  const LayerPlan& p = plan("forward_layers");
  const int L = spec().num_layers;
  M3_CHECK(0 <= first && first <= last && last <= L, "{}.forward_layers: [{}, {}) is not a range of the model's {} layers",
           who(), first, last, L);
  if (first == last) return;
  load_x(x, stream);
  run_range(p, first, last, stream);
  // The op after the range (layer last's input norm, or the final norm) adds the last sublayer's
  // output to the residual (x += f) as its first step: run it, and x is the stream after the range
  // (its normed output is left unused).
  const OpCall& next = p.ops[size_t(p.layer_first_op(last))];
  M3_CHECK(next.kind == OpKind::RmsNorm, "{}: the op after layer {} is '{}', not a norm", who(), last - 1, next.name);
  fw_->run_ops(p, p.layer_first_op(last), p.layer_first_op(last) + 1, stream);
  M3_CUDA_CHECK(cudaMemcpyAsync(x, fw_->act().x.get(), size_t(p.shape.rows) * size_t(spec().hidden) * 4,
                                cudaMemcpyDeviceToDevice, stream));
}

void DeviceLayers::logits(const float* x, float* out, cudaStream_t stream) {
  const LayerPlan& p = plan("logits");
  M3_CHECK(out, "{}.logits: no output", who());
  load_x(x, stream);
  const int fin = p.layer_first_op(spec().num_layers);
  fw_->run_ops(p, fin, fin + 1, stream);  // the final norm
  Activations& act = fw_->act();
  const int H = spec().hidden, V = spec().vocab_size, R = num_out_rows();
  const DenseWeight lm = fw_->model().weights().lm_head();
  const int gcap = int(act.gather.bytes() / (size_t(H) * 4));
  for (int r0 = 0; r0 < R; r0 += gcap) {
    const int r = std::min(gcap, R - r0);
    launch(make_gather_rows_params(act.a.get<float>(), H, act.rows.get<int32_t>() + r0, r, H, act.gather.get<float>(), H),
           stream);
    const ActIn in{act.gather.get<float>(), DType::F32, H};
    if (!comm_) {
      linear_dense(lm, in, r, out + size_t(r0) * V, V, stream);
      continue;
    }
    // this rank's vocabulary columns, then every rank's (the plan's lm_head at tensor parallelism)
    linear_dense(lm, in, r, act.logits_local.get<float>(), lm.rows, stream);
    launch(make_vocab_gather_params(comm_.get(), act.logits_local.get<float>(), r, lm.rows, act.tp_gather.get<float>(),
                                    out + size_t(r0) * V, V),
           stream);
  }
}

}  // namespace m3::native
