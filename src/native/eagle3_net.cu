// native/eagle3_net.h: the EAGLE3 draft on one GPU.
#include "native/eagle3_net.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/codecs.h"
#include "kernels/eagle3_draft.cuh"
#include "native/cuda_check.h"
#include "native/dev_buf.h"
#include "native/launch.cuh"
#include "native/linear.h"
#include "native/norm.h"

namespace m3::native {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// BF16 rows of the given matrices stacked ([sum rows][ld], ld a multiple of 8 elements, zero past cols).
struct DevMat {
  DevBuf buf;
  int rows = 0, cols = 0;
  int64_t ld = 0;  // elements
  DenseWeight view() const { return {buf.get(), DType::BF16, rows, cols, ld * 2}; }
};

DevMat upload(std::initializer_list<const Mat*> parts, const char* what) {
  DevMat m;
  m.cols = (*parts.begin())->cols;
  for (const Mat* p : parts) {
    M3_CHECK(p->cols == m.cols && p->rows > 0, "EAGLE3 draft on the GPU: {} has a part of [{} x {}], expected {} columns",
             what, p->rows, p->cols, m.cols);
    m.rows += p->rows;
  }
  m.ld = round_up(m.cols, 8);
  std::vector<uint16_t> host(size_t(m.rows) * size_t(m.ld), 0);
  int r0 = 0;
  for (const Mat* p : parts) {
    for (int r = 0; r < p->rows; ++r)
      for (int c = 0; c < p->cols; ++c) host[size_t(r0 + r) * size_t(m.ld) + size_t(c)] = f32_to_bf16(p->row(r)[c]);
    r0 += p->rows;
  }
  m.buf = DevBuf(host.size() * 2);
  M3_CUDA_CHECK(cudaMemcpy(m.buf.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  return m;
}

DevBuf upload_norm(const Vec& v) {
  std::vector<uint16_t> host(v.size());
  for (size_t i = 0; i < v.size(); ++i) host[i] = f32_to_bf16(v[i]);
  DevBuf b(host.size() * 2);
  M3_CUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  return b;
}

// fp32 rows [rows][ld] (ld a multiple of 4 floats: 16-byte aligned rows)
struct Rows {
  DevBuf buf;
  int64_t ld = 0;
  Rows() = default;
  Rows(int rows, int cols) : buf(size_t(rows) * size_t(round_up(cols, 4)) * 4), ld(round_up(cols, 4)) {}
  float* row(int i) const { return buf.get<float>() + int64_t(i) * ld; }
};

struct CudaSeq final : Eagle3SeqState {
  DevBuf k, v;  // [cap][kv_dim] fp32
  int cap = 0;
  DevBuf observed, drafted;  // [hidden] fp32 pre-norm rows
  bool has_observed = false, has_drafted = false;
};

}  // namespace

struct CudaEagle3Net::Impl {
  Mat embed_copy;  // host: a call's rows are gathered here
  std::vector<int32_t> d2t;
  DevMat fc, qkv, wo, gate_up, down, lm_head;
  DevBuf input_norm, hidden_norm, post_norm, norm, inv_freq;
  int chunk = 0;
  Rows emb, aux, h, a, r, qkvo, o, y, z, gu, act, xn, logits;
  cudaStream_t stream = nullptr;
};

CudaEagle3Net::CudaEagle3Net(Eagle3Spec spec, Eagle3Weights w, int max_rows)
    : s_(std::move(spec)), d_(std::make_unique<Impl>()) {
  const int H = s_.hidden, I = s_.intermediate, qd = s_.q_dim(), kd = s_.kv_dim();
  M3_CHECK(s_.head_dim > 0 && s_.head_dim % 2 == 0 && s_.head_dim <= kernels::kDraftAttnMaxHd,
           "EAGLE3 draft on the GPU: head_dim {} must be even and at most {}", s_.head_dim, kernels::kDraftAttnMaxHd);
  M3_CHECK(s_.num_kv_heads > 0 && s_.num_heads % s_.num_kv_heads == 0,
           "EAGLE3 draft on the GPU: {} heads are not a multiple of {} kv heads", s_.num_heads, s_.num_kv_heads);
  M3_CHECK(max_rows >= 1, "EAGLE3 draft on the GPU: max_rows {} < 1", max_rows);
  M3_CHECK(w.embed.rows == s_.vocab && w.embed.cols == H && w.lm_head.rows == s_.draft_vocab &&
               w.lm_head.cols == H,
           "EAGLE3 draft on the GPU: embedding [{} x {}] / lm_head [{} x {}] do not match the spec (vocab {}, draft "
           "vocab {}, hidden {})",
           w.embed.rows, w.embed.cols, w.lm_head.rows, w.lm_head.cols, s_.vocab, s_.draft_vocab, H);
  Impl& d = *d_;
  d.embed_copy = std::move(w.embed);
  d.d2t = std::move(w.d2t);
  d.fc = upload({&w.fc}, "fc");
  d.qkv = upload({&w.wq, &w.wk, &w.wv}, "q/k/v_proj");
  d.wo = upload({&w.wo}, "o_proj");
  d.gate_up = upload({&w.gate, &w.up}, "gate/up_proj");
  d.down = upload({&w.down}, "down_proj");
  d.lm_head = upload({&w.lm_head}, "lm_head");
  d.input_norm = upload_norm(w.input_norm);
  d.hidden_norm = upload_norm(w.hidden_norm);
  d.post_norm = upload_norm(w.post_norm);
  d.norm = upload_norm(w.norm);
  const std::vector<double> inv = eagle3_inv_freq(s_);
  d.inv_freq = DevBuf(inv.size() * sizeof(double));
  M3_CUDA_CHECK(cudaMemcpy(d.inv_freq.get(), inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice));
  const int C = d.chunk = max_rows;
  d.emb = Rows(C, H);
  d.aux = Rows(C, s_.fc_in());
  d.h = Rows(C, H);
  d.a = Rows(C, 2 * H);
  d.r = Rows(C, H);
  d.qkvo = Rows(C, qd + 2 * kd);
  d.o = Rows(C, qd);
  d.y = Rows(C, H);
  d.z = Rows(C, H);
  d.gu = Rows(C, 2 * I);
  d.act = Rows(C, I);
  d.xn = Rows(1, H);
  d.logits = Rows(1, s_.draft_vocab);
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
}

CudaEagle3Net::~CudaEagle3Net() {
  if (d_ && d_->stream) cudaStreamDestroy(d_->stream);
}

size_t CudaEagle3Net::device_bytes() const {
  const Impl& d = *d_;
  size_t b = 0;
  for (const DevMat* m : {&d.fc, &d.qkv, &d.wo, &d.gate_up, &d.down, &d.lm_head}) b += m->buf.bytes();
  for (const Rows* r : {&d.emb, &d.aux, &d.h, &d.a, &d.r, &d.qkvo, &d.o, &d.y, &d.z, &d.gu, &d.act, &d.xn, &d.logits})
    b += r->buf.bytes();
  return b;
}

std::unique_ptr<Eagle3SeqState> CudaEagle3Net::new_sequence() {
  auto s = std::make_unique<CudaSeq>();
  s->observed = DevBuf(size_t(s_.hidden) * 4);
  s->drafted = DevBuf(size_t(s_.hidden) * 4);
  return s;
}

int32_t CudaEagle3Net::observe(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux) {
  M3_CHECK(aux, "EAGLE3 draft on the GPU: observe without aux rows");
  return run(s, start, tokens, aux, Src::Aux);
}

int32_t CudaEagle3Net::draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) {
  return run(s, pos, std::span<const int32_t>(&token, 1), nullptr, from_observed ? Src::Observed : Src::Drafted);
}

std::vector<float> CudaEagle3Net::last_prenorm(const Eagle3SeqState& st, bool observed) const {
  const auto& s = static_cast<const CudaSeq&>(st);
  std::vector<float> out(static_cast<size_t>(s_.hidden));
  M3_CUDA_CHECK(cudaMemcpy(out.data(), (observed ? s.observed : s.drafted).get(), out.size() * 4,
                           cudaMemcpyDeviceToHost));
  return out;
}

int32_t CudaEagle3Net::run(Eagle3SeqState& st, int32_t start, std::span<const int32_t> tokens, const float* aux,
                           Src src) {
  auto& s = static_cast<CudaSeq&>(st);
  Impl& d = *d_;
  const int n = int(tokens.size()), H = s_.hidden, I = s_.intermediate, kd = s_.kv_dim();
  M3_CHECK(n >= 1 && start >= 0, "EAGLE3 draft on the GPU: {} rows from position {}", n, start);
  M3_CHECK(src == Src::Aux || n == 1, "EAGLE3 draft on the GPU: a draft row comes alone");
  M3_CHECK(src != Src::Observed || s.has_observed, "EAGLE3 draft on the GPU: a draft at position {} before any observed row",
           start);
  M3_CHECK(src != Src::Drafted || s.has_drafted, "EAGLE3 draft on the GPU: a draft at position {} chained to no draft",
           start);
  for (int i = 0; i < n; ++i)
    M3_CHECK(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < s_.vocab,
             "EAGLE3 draft on the GPU: row {} (position {}) has token {} outside the vocabulary [0, {})", i, start + i,
             tokens[size_t(i)], s_.vocab);
  cudaStream_t st_ = d.stream;
  // the cache must hold positions [0, start + n)
  const int need = start + n;
  if (need > s.cap) {
    const int cap = std::max({need, 2 * s.cap, 64});
    DevBuf k(size_t(cap) * size_t(kd) * 4), v(size_t(cap) * size_t(kd) * 4);
    if (s.cap) {
      M3_CUDA_CHECK(cudaMemcpyAsync(k.get(), s.k.get(), size_t(s.cap) * kd * 4, cudaMemcpyDeviceToDevice, st_));
      M3_CUDA_CHECK(cudaMemcpyAsync(v.get(), s.v.get(), size_t(s.cap) * kd * 4, cudaMemcpyDeviceToDevice, st_));
      M3_CUDA_CHECK(cudaStreamSynchronize(st_));
    }
    s.k = std::move(k), s.v = std::move(v), s.cap = cap;
  }
  auto act = [](const Rows& r) { return ActIn{r.buf.get<float>(), DType::F32, r.ld}; };
  std::vector<float> emb(size_t(std::min(n, d.chunk)) * size_t(d.emb.ld));
  for (int c0 = 0; c0 < n; c0 += d.chunk) {
    const int m = std::min(d.chunk, n - c0), pos0 = start + c0;
    const bool last = c0 + m == n;
    for (int i = 0; i < m; ++i)
      std::copy_n(d.embed_copy.row(tokens[size_t(c0 + i)]), H, emb.data() + size_t(i) * size_t(d.emb.ld));
    M3_CUDA_CHECK(cudaMemcpyAsync(d.emb.row(0), emb.data(), size_t(m) * d.emb.ld * 4, cudaMemcpyHostToDevice, st_));
    if (src == Src::Aux) {
      M3_CUDA_CHECK(cudaMemcpy2DAsync(d.aux.row(0), d.aux.ld * 4, aux + int64_t(c0) * s_.fc_in(),
                                      size_t(s_.fc_in()) * 4, size_t(s_.fc_in()) * 4, size_t(m),
                                      cudaMemcpyHostToDevice, st_));
      linear_dense(d.fc.view(), act(d.aux), m, d.h.row(0), d.h.ld, st_);
    } else {
      M3_CUDA_CHECK(cudaMemcpyAsync(d.h.row(0), (src == Src::Observed ? s.observed : s.drafted).get(), size_t(H) * 4,
                                    cudaMemcpyDeviceToDevice, st_));
    }
    kernels::RmsNormParams np;
    np.n = H, np.M = m, np.eps = s_.rms_eps;
    np.x = d.emb.row(0), np.ld_x = d.emb.ld, np.w = d.input_norm.get<uint16_t>(), np.y = d.a.row(0), np.ld_y = d.a.ld;
    llama_rms_norm(np, st_);
    np.x = d.h.row(0), np.ld_x = d.h.ld, np.w = d.hidden_norm.get<uint16_t>(), np.y = d.a.row(0) + H;
    llama_rms_norm(np, st_);
    const float* r_src = s_.norm_before_residual ? d.a.row(0) + H : d.h.row(0);
    const int64_t r_ld = s_.norm_before_residual ? d.a.ld : d.h.ld;
    M3_CUDA_CHECK(cudaMemcpy2DAsync(d.r.row(0), d.r.ld * 4, r_src, r_ld * 4, size_t(H) * 4, size_t(m),
                                    cudaMemcpyDeviceToDevice, st_));
    linear_dense(d.qkv.view(), act(d.a), m, d.qkvo.row(0), d.qkvo.ld, st_);
    kernels::DraftRopeParams rp;
    rp.qkv = d.qkvo.row(0), rp.ld = d.qkvo.ld, rp.inv_freq = d.inv_freq.get<double>();
    rp.k_cache = s.k.get<float>(), rp.v_cache = s.v.get<float>();
    rp.n = m, rp.start = pos0, rp.nh = s_.num_heads, rp.kvh = s_.num_kv_heads, rp.hd = s_.head_dim;
    launch_op<kernels::DraftRopeOp>(rp, kernels::draft_rope_shape(rp), st_, "eagle3 rope");
    kernels::DraftAttnParams ap;
    ap.q = d.qkvo.row(0), ap.ld_q = d.qkvo.ld, ap.k_cache = s.k.get<float>(), ap.v_cache = s.v.get<float>();
    ap.o = d.o.row(0), ap.ld_o = d.o.ld;
    ap.n = m, ap.start = pos0, ap.nh = s_.num_heads, ap.kvh = s_.num_kv_heads, ap.hd = s_.head_dim;
    ap.scale = float(1.0 / std::sqrt(double(s_.head_dim)));
    launch_op<kernels::DraftAttnOp>(ap, kernels::draft_attn_shape(ap), st_, "eagle3 attention");
    linear_dense(d.wo.view(), act(d.o), m, d.y.row(0), d.y.ld, st_);
    // r += o_proj; z = N(r; post_attention_layernorm)
    np = {};
    np.n = H, np.M = m, np.eps = s_.rms_eps;
    np.x = d.y.row(0), np.ld_x = d.y.ld, np.residual = d.r.row(0), np.ld_res = d.r.ld;
    np.residual_out = d.r.row(0), np.ld_res_out = d.r.ld, np.w = d.post_norm.get<uint16_t>();
    np.y = d.z.row(0), np.ld_y = d.z.ld;
    llama_rms_norm(np, st_);
    linear_dense(d.gate_up.view(), act(d.z), m, d.gu.row(0), d.gu.ld, st_);
    kernels::DraftSiluParams sp{d.gu.row(0), d.gu.ld, d.act.row(0), d.act.ld, m, I};
    launch_op<kernels::DraftSiluOp>(sp, kernels::draft_silu_shape(sp), st_, "eagle3 silu");
    linear_dense(d.down.view(), act(d.act), m, d.y.row(0), d.y.ld, st_);
    if (!last) continue;
    // the last row: r += mlp (its pre-norm output), its logits from N(r; norm)
    np = {};
    np.n = H, np.M = 1, np.eps = s_.rms_eps;
    np.x = d.y.row(m - 1), np.ld_x = d.y.ld, np.residual = d.r.row(m - 1), np.ld_res = d.r.ld;
    np.residual_out = d.r.row(m - 1), np.ld_res_out = d.r.ld, np.w = d.norm.get<uint16_t>();
    np.y = d.xn.row(0), np.ld_y = d.xn.ld;
    llama_rms_norm(np, st_);
    linear_dense(d.lm_head.view(), act(d.xn), 1, d.logits.row(0), d.logits.ld, st_);
    DevBuf& keep = src == Src::Aux ? s.observed : s.drafted;
    M3_CUDA_CHECK(cudaMemcpyAsync(keep.get(), d.r.row(m - 1), size_t(H) * 4, cudaMemcpyDeviceToDevice, st_));
  }
  logits_.resize(size_t(s_.draft_vocab));
  M3_CUDA_CHECK(cudaMemcpyAsync(logits_.data(), d.logits.row(0), logits_.size() * 4, cudaMemcpyDeviceToHost, st_));
  M3_CUDA_CHECK(cudaStreamSynchronize(st_));
  (src == Src::Aux ? s.has_observed : s.has_drafted) = true;
  return eagle3_greedy(logits_.data(), s_.draft_vocab, d.d2t);
}

}  // namespace m3::native
