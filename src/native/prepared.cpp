// PreparedWeights: the device arena, its pinned double-buffered staging sink, the progress bar,
// and the typed views.
#include "native/prepared.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/weight_table.h"
#include "native/cuda_check.h"

namespace m3::native {

namespace {

// Two pinned windows: one is filled by the quantizer threads while the other's copy runs.
class DeviceSink final : public ArenaSink {
 public:
  DeviceSink(uint8_t* dev, uint64_t dev_bytes, size_t staging) : dev_(dev), dev_bytes_(dev_bytes), half_(staging / 2) {
    M3_CHECK(half_ >= 4096, "prepare: staging of {} bytes is too small", staging);
    M3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
      M3_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_[i]), half_, cudaHostAllocDefault));
      M3_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
      M3_CUDA_CHECK(cudaEventRecord(done_[i], stream_));
    }
  }
  ~DeviceSink() override {
    cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      cudaFreeHost(host_[i]);
      cudaEventDestroy(done_[i]);
    }
    cudaStreamDestroy(stream_);
  }
  size_t max_chunk() const override { return half_; }
  uint8_t* begin_chunk(uint64_t offset, size_t bytes) override {
    M3_CHECK(bytes <= half_ && offset + bytes <= dev_bytes_, "prepare: chunk [{}, {}) outside the arena of {} bytes",
             offset, offset + bytes, dev_bytes_);
    M3_CUDA_CHECK(cudaEventSynchronize(done_[cur_]));  // the window's previous copy has finished
    off_ = offset;
    len_ = bytes;
    return host_[cur_];
  }
  void end_chunk() override {
    M3_CUDA_CHECK(cudaMemcpyAsync(dev_ + off_, host_[cur_], len_, cudaMemcpyHostToDevice, stream_));
    M3_CUDA_CHECK(cudaEventRecord(done_[cur_], stream_));
    cur_ ^= 1;
  }
  void finish() { M3_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  uint8_t* dev_;
  uint64_t dev_bytes_;
  size_t half_;
  cudaStream_t stream_ = nullptr;
  uint8_t* host_[2] = {};
  cudaEvent_t done_[2] = {};
  int cur_ = 0;
  uint64_t off_ = 0;
  size_t len_ = 0;
};

class ProgressBar {
 public:
  explicit ProgressBar(bool on) : on_(on), t0_(std::chrono::steady_clock::now()) {}
  void operator()(uint64_t done, uint64_t total) {
    if (!on_ || total == 0) return;
    const int permille = int(done * 1000 / total);
    if (permille == last_ && done != total) return;
    last_ = permille;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const int bar = permille * 40 / 1000;
    std::fprintf(stderr, "\rprepare [%.*s%.*s] %5.1f%%  %.2f / %.2f GiB  %.0f s", bar,
                 "########################################", 40 - bar, "                                        ",
                 permille / 10.0, double(done) / (1 << 30), double(total) / (1 << 30), s);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  int last_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

ArenaAddr::ArenaAddr(std::vector<Borrowed> tensors) : at_(std::move(tensors)) {
  std::sort(at_.begin(), at_.end(), [](const Borrowed& x, const Borrowed& y) { return x.offset < y.offset; });
  for (size_t i = 0; i < at_.size(); ++i) {
    M3_CHECK(at_[i].data, "prepared: the borrowed tensor at arena offset {} has no buffer", at_[i].offset);
    M3_CHECK(i == 0 || at_[i].offset >= at_[i - 1].offset + at_[i - 1].bytes,
             "prepared: borrowed tensors at arena offsets {} and {} overlap", at_[i - 1].offset, at_[i].offset);
  }
}

const uint8_t* ArenaAddr::range(uint64_t offset, uint64_t n) const {
  if (base_) return base_ + offset;
  auto it = std::upper_bound(at_.begin(), at_.end(), offset, [](uint64_t o, const Borrowed& b) { return o < b.offset; });
  M3_CHECK(it != at_.begin() && offset + n <= std::prev(it)->offset + std::prev(it)->bytes,
           "prepared: arena bytes [{}, {}) are not inside one borrowed tensor", offset, offset + n);
  --it;
  return it->data + (offset - it->offset);
}

const uint8_t* ArenaAddr::operator()(const PTensor& t) const { return t.empty() ? nullptr : range(t.offset, t.bytes); }

static Mxfp4Experts experts_view(const ArenaAddr& at, const PMxfp4& m) {
  Mxfp4Experts e;
  if (m.codes.empty()) return e;
  e.codes = at(m.codes);
  e.scales = at(m.scales);
  e.ld = m.codes.row_bytes;
  e.sld = m.scales.row_bytes;
  e.fp8 = m.codes.dtype == DType::F8_E4M3;  // MXFP8 experts
  e.slot_codes = int64_t(m.codes.slot_bytes());
  e.slot_scales = int64_t(m.scales.slot_bytes());
  e.slots = m.codes.slots;
  e.rows = int(m.codes.rows);
  e.cols = int(m.codes.cols);
  return e;
}

Fp8Weight arena_fp8_view(const ArenaAddr& at, const PFp8& m) {
  if (m.mx())  // MXFP8: E8M0 block scales, no row scale
    return Fp8Weight{at(m.codes), nullptr, int(m.codes.rows), int(m.codes.cols), m.codes.row_bytes,
                     m.codes.tiled, at(m.scales), m.scales.row_bytes};
  return Fp8Weight{at(m.codes), reinterpret_cast<const float*>(at(m.scales)), int(m.codes.rows),
                   int(m.codes.cols), m.codes.row_bytes, m.codes.tiled};
}

MoeWeights arena_moe_view(const ArenaAddr& at, const PreparedLayout& L, int l) {
  M3_CHECK(l >= 0 && size_t(l) < L.layers.size(), "prepared: layer {} out of range ({} layers)", l, L.layers.size());
  const auto& Y = L.layers[size_t(l)];
  M3_CHECK(Y.moe, "prepared: layer {} is not a MoE layer", l);
  const ModelSpec& s = L.spec;
  MoeWeights w;
  w.router = DenseWeight{at(Y.router), Y.router.dtype, int(Y.router.rows), int(Y.router.cols), Y.router.row_bytes};
  w.router_bias = reinterpret_cast<const float*>(at(Y.router_bias));
  w.w13 = experts_view(at, Y.w13);
  w.w2 = experts_view(at, Y.w2);
  w.shared_in_slot = Y.shared_in_slot;
  w.shared_w13 = experts_view(at, Y.shared_w13);
  w.shared_w2 = experts_view(at, Y.shared_w2);
  w.E = s.num_experts;
  w.K = s.top_k;
  w.routed_scale = s.routed_scale;
  w.alpha = s.swiglu_alpha;
  w.limit = s.swiglu_limit;
  return w;
}

std::unique_ptr<PreparedWeights> PreparedWeights::create(const ModelSpec& spec, const WeightSource& src,
                                                         const PrepareOptions& opt, const PrepareLoadOptions& lo) {
  std::unique_ptr<PreparedWeights> pw(new PreparedWeights());
  pw->layout_ = plan_prepared(spec, opt);
  const uint64_t bytes = pw->layout_.total_bytes;
  M3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pw->base_), bytes));
  pw->at_ = ArenaAddr(pw->base_);
  {
    DeviceSink sink(pw->base_, bytes, lo.staging_bytes);
    ThreadPool pool(lo.threads);
    ProgressBar bar(lo.progress);
    fill_prepared(pw->layout_, src, sink, pool, [&](uint64_t d, uint64_t t) { bar(d, t); });
    sink.finish();
  }
  if (lo.progress) std::fprintf(stderr, "prepared weights on the device:\n%s", pw->layout_.describe_bytes().c_str());
  return pw;
}

std::unique_ptr<PreparedWeights> PreparedWeights::create_on_device(
    const PreparedLayout& layout, const std::function<void(uint8_t*, cudaStream_t)>& fill, cudaStream_t stream) {
  M3_CHECK(bool(fill), "prepared: create_on_device needs a fill function");
  std::unique_ptr<PreparedWeights> pw(new PreparedWeights());
  pw->layout_ = layout;
  M3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pw->base_), layout.total_bytes));
  pw->at_ = ArenaAddr(pw->base_);
  M3_CUDA_CHECK(cudaMemsetAsync(pw->base_, 0, layout.total_bytes, stream));
  fill(pw->base_, stream);
  M3_CUDA_CHECK(cudaStreamSynchronize(stream));
  return pw;
}

std::unique_ptr<PreparedWeights> PreparedWeights::load(const std::filesystem::path& dir, const PrepareOptions& opt,
                                                       const PrepareLoadOptions& lo) {
  const ModelSpec spec = load_model_spec(dir);
  SafetensorsSet files = SafetensorsSet::open(dir);
  WeightTable table = build_checkpoint_table(spec, files, dir);
  WeightBinding bind = bind_weights(table, files);
  const PrepareOptions o = prepare_options_for(bind, opt);  // MXFP8 projections as stored
  if (const std::string note = arena_requantization_note(bind, o); !note.empty())
    std::fprintf(stderr, "m3mono: note: %s: %s\n", dir.string().c_str(), note.c_str());
  auto src = make_weight_source(bind);
  return create(spec, *src, o, lo);
}

std::unique_ptr<PreparedWeights> PreparedWeights::borrow(const PreparedLayout& layout,
                                                         const std::vector<std::pair<TensorSpec, const void*>>& tensors) {
  // every tensor the layout has, by name and offset, exactly once
  std::vector<TensorSpec> want = model_tensor_specs(layout);
  for (int l = 0; l < layout.spec.num_layers; ++l) {
    std::vector<TensorSpec> t = layer_tensor_specs(layout, l);
    want.insert(want.end(), t.begin(), t.end());
  }
  std::vector<ArenaAddr::Borrowed> at;
  for (const auto& [spec, data] : tensors) {
    const auto it = std::find_if(want.begin(), want.end(),
                                 [&](const TensorSpec& w) { return w.offset == spec.offset && w.name == spec.name; });
    M3_CHECK(it != want.end(), "prepared: borrowed tensor '{}' (arena offset {}) is not a tensor of this layout, or "
             "is given twice", spec.name, spec.offset);
    M3_CHECK(data != nullptr, "prepared: borrowed tensor '{}' has no buffer", spec.name);
    want.erase(it);
    if (spec.bytes) at.push_back(ArenaAddr::Borrowed{spec.offset, spec.bytes, static_cast<const uint8_t*>(data)});
  }
  M3_CHECK(want.empty(), "prepared: {} tensor(s) of the layout not borrowed, the first '{}' ({})", want.size(),
           want.empty() ? "" : want.front().name, want.empty() ? "" : want.front().describe());
  std::unique_ptr<PreparedWeights> pw(new PreparedWeights());
  pw->layout_ = layout;
  pw->at_ = ArenaAddr(std::move(at));
  return pw;
}

PreparedWeights::~PreparedWeights() {
  if (base_) cudaFree(base_);
}

ArenaReader PreparedWeights::reader() const {
  const ArenaAddr at = at_;
  const uint64_t total = layout_.total_bytes;
  return [at, total](uint64_t off, uint64_t n, void* dst) {
    M3_CHECK(off + n <= total, "prepared: read [{}, {}) outside {} bytes", off, off + n, total);
    M3_CUDA_CHECK(cudaMemcpy(dst, at.range(off, n), n, cudaMemcpyDeviceToHost));
  };
}

const PreparedLayerLayout& PreparedWeights::layer(int l) const {
  M3_CHECK(l >= 0 && l < int(layout_.layers.size()), "prepared: layer {} out of range [0, {})", l,
           layout_.layers.size());
  return layout_.layers[size_t(l)];
}

Fp8Weight PreparedWeights::qkv(int l) const { return arena_fp8_view(at_, layer(l).qkv); }
Fp8Weight PreparedWeights::o(int l) const { return arena_fp8_view(at_, layer(l).o); }
LayerNormWeights PreparedWeights::norms(int l) const {
  const auto& Y = layer(l);
  auto v = [&](const PTensor& t) { return reinterpret_cast<const uint16_t*>(at(t)); };
  return LayerNormWeights{v(Y.input_norm), v(Y.post_norm), v(Y.q_norm), v(Y.k_norm), v(Y.iq_norm), v(Y.ik_norm)};
}
static DenseWeight dense_view(const uint8_t* p, const PTensor& t) {
  return DenseWeight{p, t.dtype, int(t.rows), int(t.cols), t.row_bytes};
}
DenseWeight PreparedWeights::dense_gate_up(int l) const {
  const auto& Y = layer(l);
  M3_CHECK(!Y.moe, "prepared: layer {} has no dense MLP", l);
  return dense_view(at(Y.dense_gate_up), Y.dense_gate_up);
}
DenseWeight PreparedWeights::dense_down(int l) const {
  const auto& Y = layer(l);
  M3_CHECK(!Y.moe, "prepared: layer {} has no dense MLP", l);
  return dense_view(at(Y.dense_down), Y.dense_down);
}
MoeWeights PreparedWeights::moe(int l) const { return arena_moe_view(at_, layout_, l); }
DenseWeight PreparedWeights::embed() const { return dense_view(at(layout_.embed), layout_.embed); }
DenseWeight PreparedWeights::lm_head() const { return dense_view(at(layout_.lm_head), layout_.lm_head); }
const uint16_t* PreparedWeights::final_norm() const {
  return reinterpret_cast<const uint16_t*>(at(layout_.final_norm));
}

}  // namespace m3::native
