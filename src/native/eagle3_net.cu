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
#include "native/embed.h"
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
  m.buf = DevBuf(size_t(m.rows) * size_t(m.ld) * 2);
  // in slices of ~32 MB (an embedding of 200K rows would otherwise need a 2.5 GB host copy)
  const int slice = int(std::max<int64_t>(1, (int64_t(32) << 20) / (m.ld * 2)));
  std::vector<uint16_t> host(size_t(std::min(slice, m.rows)) * size_t(m.ld), 0);
  int r0 = 0;
  for (const Mat* p : parts)
    for (int s0 = 0; s0 < p->rows; s0 += slice) {
      const int n = std::min(slice, p->rows - s0);
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < p->cols; ++c) host[size_t(r) * size_t(m.ld) + size_t(c)] = f32_to_bf16(p->row(s0 + r)[c]);
      M3_CUDA_CHECK(cudaMemcpy(m.buf.get<uint16_t>() + int64_t(r0 + s0) * m.ld, host.data(), size_t(n) * m.ld * 2,
                               cudaMemcpyHostToDevice));
      if (s0 + n == p->rows) r0 += p->rows;
    }
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

}  // namespace

struct CudaEagle3Seq final : Eagle3SeqState {
  DevBuf k, v;  // [cap][kv_dim] fp32
  int cap = 0;
  DevBuf observed, drafted;  // [hidden] fp32 pre-norm rows
  bool has_observed = false, has_drafted = false;
};

void eagle3_greedy_device(const float* logits, int n, const int32_t* d2t, int32_t* out, cudaStream_t stream) {
  M3_CHECK(logits && out && n >= 1, "EAGLE3 greedy on the GPU: {} logits", n);
  const kernels::DraftArgmaxParams p{logits, n, d2t, out};
  launch_op<kernels::DraftArgmaxOp>(p, kernels::draft_argmax_shape(p), stream, "eagle3 greedy");
}

struct CudaEagle3Net::Impl {
  DevMat embed, fc, qkv, wo, gate_up, down, lm_head;
  DevBuf d2t;  // [draft_vocab] int32, or empty
  DevBuf input_norm, hidden_norm, post_norm, norm, inv_freq;
  int chunk = 0;
  Rows emb, aux, h, a, r, qkvo, o, y, z, gu, act, xn, logits;
  DevBuf attn_part;  // the attention's split states (kernels::draft_attn_part_floats)
  int sms = 0;
  DevBuf ids;  // int32: a chunk's token ids, then a chain's ids (capacity ids_cap)
  int ids_cap = 0;
  std::vector<int32_t> host_ids;
  cudaStream_t stream = nullptr;
  // profile: an event after each launch of a call, summed by stage after its sync
  bool profile = false;
  int calls = 0;
  std::vector<cudaEvent_t> events;
  std::vector<const char*> marks;  // the stage each recorded event ends
  std::vector<std::pair<std::string, double>> sums;
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
  d.embed = upload({&w.embed}, "embed_tokens");
  w.embed = Mat();  // the host copy is not needed any more
  if (!w.d2t.empty()) {
    M3_CHECK(int(w.d2t.size()) == s_.draft_vocab, "EAGLE3 draft on the GPU: d2t has {} entries for a draft vocabulary of {}",
             w.d2t.size(), s_.draft_vocab);
    d.d2t = DevBuf(w.d2t.size() * 4);
    M3_CUDA_CHECK(cudaMemcpy(d.d2t.get(), w.d2t.data(), w.d2t.size() * 4, cudaMemcpyHostToDevice));
  }
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
  {
    int dev = 0;
    M3_CUDA_CHECK(cudaGetDevice(&dev));
    M3_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    // splits only when a chunk's items are fewer than the SMs: at most 3 x SMs items of states
    d.attn_part = DevBuf(size_t(3) * size_t(d.sms) * kernels::kDraftAttnHeads * size_t(2 + s_.head_dim) * 4);
  }
  d.ids_cap = C + 8;
  d.ids = DevBuf(size_t(d.ids_cap) * 4);
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
}

CudaEagle3Net::~CudaEagle3Net() {
  if (!d_) return;
  for (cudaEvent_t e : d_->events) cudaEventDestroy(e);
  if (d_->stream) cudaStreamDestroy(d_->stream);
}

size_t CudaEagle3Net::device_bytes() const {
  const Impl& d = *d_;
  size_t b = 0;
  for (const DevMat* m : {&d.embed, &d.fc, &d.qkv, &d.wo, &d.gate_up, &d.down, &d.lm_head}) b += m->buf.bytes();
  b += d.d2t.bytes() + d.ids.bytes() + d.attn_part.bytes();
  for (const Rows* r : {&d.emb, &d.aux, &d.h, &d.a, &d.r, &d.qkvo, &d.o, &d.y, &d.z, &d.gu, &d.act, &d.xn, &d.logits})
    b += r->buf.bytes();
  return b;
}

std::unique_ptr<Eagle3SeqState> CudaEagle3Net::new_sequence() {
  auto s = std::make_unique<CudaEagle3Seq>();
  s->observed = DevBuf(size_t(s_.hidden) * 4);
  s->drafted = DevBuf(size_t(s_.hidden) * 4);
  return s;
}

void CudaEagle3Net::set_profile(bool on) {
  Impl& d = *d_;
  d.profile = on;
  d.calls = 0;
  d.sums.clear();
}

std::vector<std::pair<std::string, double>> CudaEagle3Net::profile() const { return d_->sums; }
int CudaEagle3Net::profiled_calls() const { return d_->calls; }

void CudaEagle3Net::mark(const char* stage) {
  Impl& d = *d_;
  if (!d.profile) return;
  if (d.marks.size() + 1 > d.events.size()) {
    cudaEvent_t e;
    M3_CUDA_CHECK(cudaEventCreate(&e));
    d.events.push_back(e);
  }
  M3_CUDA_CHECK(cudaEventRecord(d.events[d.marks.size()], d.stream));
  d.marks.push_back(stage);
}

void CudaEagle3Net::check_tokens(std::span<const int32_t> tokens, int32_t start) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    M3_CHECK(tokens[i] >= 0 && tokens[i] < s_.vocab,
             "EAGLE3 draft on the GPU: row {} (position {}) has token {} outside the vocabulary [0, {})", i,
             start + int64_t(i), tokens[i], s_.vocab);
}

void CudaEagle3Net::reserve(CudaEagle3Seq& s, int need) {
  if (need <= s.cap) return;
  const int kd = s_.kv_dim();
  const int cap = std::max({need, 2 * s.cap, 64});
  DevBuf k(size_t(cap) * size_t(kd) * 4), v(size_t(cap) * size_t(kd) * 4);
  if (s.cap) {
    M3_CUDA_CHECK(cudaMemcpyAsync(k.get(), s.k.get(), size_t(s.cap) * kd * 4, cudaMemcpyDeviceToDevice, d_->stream));
    M3_CUDA_CHECK(cudaMemcpyAsync(v.get(), s.v.get(), size_t(s.cap) * kd * 4, cudaMemcpyDeviceToDevice, d_->stream));
    M3_CUDA_CHECK(cudaStreamSynchronize(d_->stream));
  }
  s.k = std::move(k), s.v = std::move(v), s.cap = cap;
}

void CudaEagle3Net::rows(CudaEagle3Seq& s, int pos0, int m, const int32_t* ids, const float* aux, Src src, bool head,
                         int32_t* id_out) {
  Impl& d = *d_;
  const int H = s_.hidden, I = s_.intermediate;
  cudaStream_t st_ = d.stream;
  auto act = [](const Rows& r) { return ActIn{r.buf.get<float>(), DType::F32, r.ld}; };
  kernels::EmbedParams ep;
  ep.table = d.embed.buf.get<uint16_t>(), ep.ld = d.embed.ld, ep.V = s_.vocab, ep.H = H, ep.M = m, ep.ids = ids;
  ep.out = d.emb.row(0), ep.ld_out = d.emb.ld;
  embed(ep, st_);
  mark("embed");
  if (src == Src::Aux) {
    M3_CUDA_CHECK(cudaMemcpy2DAsync(d.aux.row(0), d.aux.ld * 4, aux, size_t(s_.fc_in()) * 4, size_t(s_.fc_in()) * 4,
                                    size_t(m), cudaMemcpyHostToDevice, st_));
    mark("aux upload");
    linear_dense(d.fc.view(), act(d.aux), m, d.h.row(0), d.h.ld, st_);
    mark("fc");
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
  mark("norms");
  linear_dense(d.qkv.view(), act(d.a), m, d.qkvo.row(0), d.qkvo.ld, st_);
  mark("qkv");
  kernels::DraftRopeParams rp;
  rp.qkv = d.qkvo.row(0), rp.ld = d.qkvo.ld, rp.inv_freq = d.inv_freq.get<double>();
  rp.k_cache = s.k.get<float>(), rp.v_cache = s.v.get<float>();
  rp.n = m, rp.start = pos0, rp.nh = s_.num_heads, rp.kvh = s_.num_kv_heads, rp.hd = s_.head_dim;
  launch_op<kernels::DraftRopeOp>(rp, kernels::draft_rope_shape(rp), st_, "eagle3 rope");
  mark("rope");
  kernels::DraftAttnParams ap;
  ap.q = d.qkvo.row(0), ap.ld_q = d.qkvo.ld, ap.k_cache = s.k.get<float>(), ap.v_cache = s.v.get<float>();
  ap.o = d.o.row(0), ap.ld_o = d.o.ld;
  ap.n = m, ap.start = pos0, ap.nh = s_.num_heads, ap.kvh = s_.num_kv_heads, ap.hd = s_.head_dim;
  ap.scale = float(1.0 / std::sqrt(double(s_.head_dim)));
  // split the keys when the rows' items alone leave the GPU idle (one row: kvh x groups items)
  const int keys = pos0 + m, base = m * s_.num_kv_heads * kernels::draft_attn_groups(ap);
  int splits = base >= d.sms ? 1 : std::min((2 * d.sms + base - 1) / base, (keys + 255) / 256);
  ap.split_keys = int(round_up((keys + splits - 1) / splits, 32));
  ap.splits = splits = (keys + ap.split_keys - 1) / ap.split_keys;
  if (splits > 1) {
    ap.part = d.attn_part.get<float>();
    M3_CHECK(kernels::draft_attn_part_floats(ap) * 4 <= int64_t(d.attn_part.bytes()),
             "EAGLE3 draft on the GPU: attention workspace of {} bytes for {} splits of {} rows", d.attn_part.bytes(),
             splits, m);
  }
  if (s_.head_dim <= 128) launch_op<kernels::DraftAttnOp<4>>(ap, kernels::draft_attn_shape(ap), st_, "eagle3 attention");
  else launch_op<kernels::DraftAttnOp<8>>(ap, kernels::draft_attn_shape(ap), st_, "eagle3 attention");
  if (splits > 1) launch_op<kernels::DraftAttnCombineOp>(ap, kernels::draft_attn_combine_shape(ap), st_, "eagle3 attention combine");
  mark("attention");
  linear_dense(d.wo.view(), act(d.o), m, d.y.row(0), d.y.ld, st_);
  mark("o_proj");
  // r += o_proj; z = N(r; post_attention_layernorm)
  np = {};
  np.n = H, np.M = m, np.eps = s_.rms_eps;
  np.x = d.y.row(0), np.ld_x = d.y.ld, np.residual = d.r.row(0), np.ld_res = d.r.ld;
  np.residual_out = d.r.row(0), np.ld_res_out = d.r.ld, np.w = d.post_norm.get<uint16_t>();
  np.y = d.z.row(0), np.ld_y = d.z.ld;
  llama_rms_norm(np, st_);
  mark("norms");
  linear_dense(d.gate_up.view(), act(d.z), m, d.gu.row(0), d.gu.ld, st_);
  mark("gate_up");
  kernels::DraftSiluParams sp{d.gu.row(0), d.gu.ld, d.act.row(0), d.act.ld, m, I};
  launch_op<kernels::DraftSiluOp>(sp, kernels::draft_silu_shape(sp), st_, "eagle3 silu");
  mark("silu");
  linear_dense(d.down.view(), act(d.act), m, d.y.row(0), d.y.ld, st_);
  mark("down");
  if (!head) return;
  // the last row: r += mlp (its pre-norm output, kept), its logits from N(r; norm), its greedy id
  np = {};
  np.n = H, np.M = 1, np.eps = s_.rms_eps;
  np.x = d.y.row(m - 1), np.ld_x = d.y.ld, np.residual = d.r.row(m - 1), np.ld_res = d.r.ld;
  np.residual_out = d.r.row(m - 1), np.ld_res_out = d.r.ld, np.w = d.norm.get<uint16_t>();
  np.y = d.xn.row(0), np.ld_y = d.xn.ld;
  llama_rms_norm(np, st_);
  DevBuf& keep = src == Src::Aux ? s.observed : s.drafted;
  M3_CUDA_CHECK(cudaMemcpyAsync(keep.get(), d.r.row(m - 1), size_t(H) * 4, cudaMemcpyDeviceToDevice, st_));
  mark("norms");
  linear_dense(d.lm_head.view(), act(d.xn), 1, d.logits.row(0), d.logits.ld, st_);
  mark("lm_head");
  eagle3_greedy_device(d.logits.row(0), s_.draft_vocab, d.d2t.bytes() ? d.d2t.get<int32_t>() : nullptr, id_out, st_);
  mark("greedy");
}

int32_t CudaEagle3Net::observe(Eagle3SeqState& st, int32_t start, std::span<const int32_t> tokens, const float* aux) {
  auto& s = static_cast<CudaEagle3Seq&>(st);
  Impl& d = *d_;
  const int n = int(tokens.size());
  M3_CHECK(aux, "EAGLE3 draft on the GPU: observe without aux rows");
  M3_CHECK(n >= 1 && start >= 0, "EAGLE3 draft on the GPU: {} rows from position {}", n, start);
  check_tokens(tokens, start);
  reserve(s, start + n);
  d.marks.clear();
  mark("start");
  int32_t* id_dev = d.ids.get<int32_t>() + d.chunk;
  for (int c0 = 0; c0 < n; c0 += d.chunk) {
    const int m = std::min(d.chunk, n - c0);
    M3_CUDA_CHECK(cudaMemcpyAsync(d.ids.get(), tokens.data() + c0, size_t(m) * 4, cudaMemcpyHostToDevice, d.stream));
    rows(s, start + c0, m, d.ids.get<int32_t>(), aux + int64_t(c0) * s_.fc_in(), Src::Aux, c0 + m == n, id_dev);
  }
  d.host_ids.resize(1);
  M3_CUDA_CHECK(cudaMemcpyAsync(d.host_ids.data(), id_dev, 4, cudaMemcpyDeviceToHost, d.stream));
  finish();
  s.has_observed = true;
  return d.host_ids[0];
}

int32_t CudaEagle3Net::draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) {
  int32_t out = 0;
  chain(static_cast<CudaEagle3Seq&>(s), pos, token, 1, &out, from_observed);
  return out;
}

void CudaEagle3Net::draft_chain(Eagle3SeqState& s, int32_t pos, int32_t token, int n, int32_t* out) {
  chain(static_cast<CudaEagle3Seq&>(s), pos, token, n, out, true);
}

void CudaEagle3Net::chain(CudaEagle3Seq& s, int32_t pos, int32_t token, int n, int32_t* out, bool from_observed) {
  Impl& d = *d_;
  M3_CHECK(n >= 1 && pos >= 0, "EAGLE3 draft on the GPU: a chain of {} rows from position {}", n, pos);
  M3_CHECK(!from_observed || s.has_observed, "EAGLE3 draft on the GPU: a draft at position {} before any observed row",
           pos);
  M3_CHECK(from_observed || s.has_drafted, "EAGLE3 draft on the GPU: a draft at position {} chained to no draft", pos);
  check_tokens(std::span<const int32_t>(&token, 1), pos);
  reserve(s, pos + n);
  if (n + 1 > d.ids_cap) {
    d.ids_cap = std::max(n + 1, 2 * d.ids_cap);
    M3_CUDA_CHECK(cudaStreamSynchronize(d.stream));
    d.ids = DevBuf(size_t(d.ids_cap) * 4);
  }
  d.marks.clear();
  mark("start");
  int32_t* ids = d.ids.get<int32_t>();  // ids[0] = token, ids[j + 1] = row j's draft
  M3_CUDA_CHECK(cudaMemcpyAsync(ids, &token, 4, cudaMemcpyHostToDevice, d.stream));
  for (int j = 0; j < n; ++j)
    rows(s, pos + j, 1, ids + j, nullptr, j == 0 && from_observed ? Src::Observed : Src::Drafted, true, ids + j + 1);
  d.host_ids.resize(size_t(n));
  M3_CUDA_CHECK(cudaMemcpyAsync(d.host_ids.data(), ids + 1, size_t(n) * 4, cudaMemcpyDeviceToHost, d.stream));
  finish();
  s.has_drafted = true;
  std::copy(d.host_ids.begin(), d.host_ids.end(), out);
}

void CudaEagle3Net::finish() {
  Impl& d = *d_;
  mark("read back");
  M3_CUDA_CHECK(cudaStreamSynchronize(d.stream));
  if (!d.profile) return;
  ++d.calls;
  for (size_t i = 1; i < d.marks.size(); ++i) {
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, d.events[i - 1], d.events[i]));
    auto it = std::find_if(d.sums.begin(), d.sums.end(), [&](const auto& e) { return e.first == d.marks[i]; });
    if (it == d.sums.end()) d.sums.emplace_back(d.marks[i], 1e3 * ms);
    else it->second += 1e3 * ms;
  }
}

std::vector<float> CudaEagle3Net::last_draft_logits() const {
  std::vector<float> out(static_cast<size_t>(s_.draft_vocab));
  M3_CUDA_CHECK(cudaStreamSynchronize(d_->stream));
  M3_CUDA_CHECK(cudaMemcpy(out.data(), d_->logits.row(0), out.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> CudaEagle3Net::last_prenorm(const Eagle3SeqState& st, bool observed) const {
  const auto& s = static_cast<const CudaEagle3Seq&>(st);
  std::vector<float> out(static_cast<size_t>(s_.hidden));
  M3_CUDA_CHECK(cudaStreamSynchronize(d_->stream));
  M3_CUDA_CHECK(cudaMemcpy(out.data(), (observed ? s.observed : s.drafted).get(), out.size() * 4,
                           cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace m3::native
