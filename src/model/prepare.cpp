// plan_prepared (arena layout of one rank), the weight sources (host fp32, memory-mapped
// checkpoint), fill_prepared (row chunks quantized in parallel into a staging window) and the
// dequantizers back to fp32 LayerWeights / ModelWeights.
#include "model/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "core/check.h"
#include "core/codecs.h"
#include "model/load_weights.h"
#include "model/tp_shard.h"
#include "model/quantize.h"

namespace m3 {

std::string_view prepared_family_name(PreparedFamily f) {
  switch (f) {
    case PreparedFamily::AttnQkv: return "attention q/k/v/index fp8";
    case PreparedFamily::AttnO: return "attention o fp8";
    case PreparedFamily::Norms: return "norms bf16";
    case PreparedFamily::DenseMlp: return "dense mlp bf16";
    case PreparedFamily::Router: return "router";
    case PreparedFamily::Experts: return "routed experts mxfp4";
    case PreparedFamily::SharedExpert: return "shared expert mxfp4";
    case PreparedFamily::Embed: return "embeddings bf16";
    case PreparedFamily::LmHead: return "lm_head bf16";
    case PreparedFamily::Count: break;
  }
  M3_FAIL("invalid prepared family {}", int(f));
}

namespace {

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
int64_t bf16_row_bytes(int64_t cols) { return int64_t(round_up(uint64_t(cols) * 2, 16)); }
int64_t f32_row_bytes(int64_t cols) { return int64_t(round_up(uint64_t(cols) * 4, 16)); }

struct Planner {
  uint64_t cur = 0;
  std::array<uint64_t, size_t(PreparedFamily::Count)> fam{};
  PTensor add(PreparedFamily f, DType dt, int64_t rows, int64_t cols, int64_t row_bytes, int slots = 1) {
    PTensor t;
    t.offset = round_up(cur, kArenaAlign);
    t.dtype = dt;
    t.rows = rows;
    t.cols = cols;
    t.row_bytes = row_bytes;
    t.slots = slots;
    t.bytes = uint64_t(slots) * t.slot_bytes();
    cur = t.offset + t.bytes;
    fam[size_t(f)] += t.bytes;
    return t;
  }
  PTensor add_tiled(PreparedFamily f, int64_t rows, int64_t cols) {  // FP8 codes, core/weight_tiles.h
    PTensor t;
    t.offset = round_up(cur, kArenaAlign);
    t.dtype = DType::F8_E4M3;
    t.rows = rows;
    t.cols = cols;
    t.row_bytes = int64_t(round_up(uint64_t(cols), kTileBlockBytes));
    t.tiled = true;
    t.bytes = t.slot_bytes();
    cur = t.offset + t.bytes;
    fam[size_t(f)] += t.bytes;
    return t;
  }
  PTensor bf16(PreparedFamily f, int64_t rows, int64_t cols) {
    return add(f, DType::BF16, rows, cols, bf16_row_bytes(cols));
  }
  bool fp8_tiled = true, mxfp8 = false;
  PFp8 fp8(PreparedFamily f, int64_t rows, int64_t cols) {
    PFp8 m;
    m.codes = fp8_tiled ? add_tiled(f, rows, cols) : add(f, DType::F8_E4M3, rows, cols, fp8_row_bytes(cols));
    if (mxfp8)  // one E8M0 byte per 32 columns, rows not padded (as the MXFP4 scales)
      m.scales = add(f, DType::E8M0, rows, mxfp4_row_blocks(cols), mxfp4_row_blocks(cols));
    else
      m.scales = add(f, DType::F32, rows, 1, 4);  // scale rows are not padded
    return m;
  }
  bool mxfp8_experts = false;
  PMxfp4 mxfp4(PreparedFamily f, int slots, int64_t rows, int64_t cols) {
    PMxfp4 m;
    if (mxfp8_experts)  // one byte an element, whole 32-element blocks (kernels/moe_mma.cuh)
      m.codes = add(f, DType::F8_E4M3, rows, cols, int64_t(round_up(uint64_t(cols), 32)), slots);
    else
      m.codes = add(f, DType::E2M1x2, rows, cols, mxfp4_row_bytes(cols), slots);
    m.scales = add(f, DType::E8M0, rows, mxfp4_row_blocks(cols), mxfp4_row_blocks(cols), slots);
    return m;
  }
};

}  // namespace

ModelSpec prepared_rank_spec(const PreparedLayout& L, int rank, int size, const char* what) {
  M3_CHECK(L.opt.tp_size == size && L.opt.tp_rank == rank,
           "{}: the prepared weights are rank {} of {}, this runs rank {} of {}{}", what, L.opt.tp_rank, L.opt.tp_size,
           rank, size, size == 1 && L.opt.tp_size > 1 ? " (tensor parallelism needs the rank's communicator)" : "");
  return size > 1 ? tp_rank_spec(L.spec, size) : L.spec;
}

PreparedLayout plan_prepared(const ModelSpec& spec, const PrepareOptions& opt) {
  spec.validate();
  const int tp = opt.tp_size;
  M3_CHECK(tp >= 1 && opt.tp_rank >= 0 && opt.tp_rank < tp, "prepare: tp_rank {} / tp_size {} invalid", opt.tp_rank,
           tp);
  auto divides = [&](int64_t v, const char* field) {
    M3_CHECK(v % tp == 0, "prepare: {} = {} is not divisible by tensor-parallel size {}", field, v, tp);
    return v / tp;
  };
  PreparedLayout L;
  L.spec = spec;
  L.opt = opt;
  L.heads = int(divides(spec.num_heads, "num_attention_heads"));
  // K/V and index heads: split when tp divides them, else replicated (tp_rank_spec's rule: each
  // rank holds the head its query heads use)
  const ModelSpec rs = tp_rank_spec(spec, tp, "prepare: tensor-parallel size");
  L.kv_heads = rs.num_kv_heads;
  L.index_heads = spec.num_sparse_layers() > 0 ? rs.index_heads : 0;
  L.kv_head0 = tp_rank_kv_head(spec, opt.tp_rank, tp);
  L.dense_inter = spec.num_moe_layers() < spec.num_layers ? divides(spec.dense_inter, "dense_intermediate_size") : 0;
  L.moe_inter = spec.num_moe_layers() > 0 ? divides(spec.moe_inter, "intermediate_size") : 0;
  L.shared_inter = spec.shared_inter > 0 ? divides(spec.shared_inter, "shared_intermediate_size") : 0;
  // the experts' down projections are MXFP4 along their columns (this rank's width): blocks of 32
  // must not straddle two ranks, so that a rank's blocks are the whole model's (and a released
  // MXFP4 checkpoint's blocks split as they are)
  auto whole_blocks = [&](int64_t per_rank, int64_t v, const char* field) {
    M3_CHECK(tp == 1 || per_rank % 32 == 0,
             "prepare: {} = {} over {} ranks gives {} columns per rank, not a multiple of the MXFP4 block (32)",
             field, v, tp, per_rank);
  };
  if (L.moe_inter > 0) whole_blocks(L.moe_inter, spec.moe_inter, "intermediate_size");
  if (L.shared_inter > 0) whole_blocks(L.shared_inter, spec.shared_inter, "shared_intermediate_size");
  L.vocab_rows = divides(spec.vocab_size, "vocab_size");
  L.vocab_row0 = L.vocab_rows * opt.tp_rank;

  using F = PreparedFamily;
  Planner P;
  P.fp8_tiled = opt.fp8_tiled;
  P.mxfp8 = opt.mxfp8_projections;
  P.mxfp8_experts = opt.mxfp8_experts;
  // MXFP8 projections: a rank's O columns start on a 32-column block, so its blocks are the file's
  M3_CHECK(!opt.mxfp8_projections || tp == 1 || (int64_t(L.heads) * spec.head_dim) % 32 == 0,
           "prepare: MXFP8 projections at {} ranks: {} O columns per rank is not a multiple of the MXFP8 block (32)",
           tp, int64_t(L.heads) * spec.head_dim);
  const int64_t H = spec.hidden;
  L.embed = P.bf16(F::Embed, spec.vocab_size, H);
  L.lm_head = P.bf16(F::LmHead, L.vocab_rows, H);
  L.final_norm = P.bf16(F::Norms, 1, H);
  L.layers.resize(size_t(spec.num_layers));
  for (int l = 0; l < spec.num_layers; ++l) {
    PreparedLayerLayout& Y = L.layers[size_t(l)];
    Y.sparse = spec.sparse(l);
    Y.moe = spec.moe(l);
    Y.input_norm = P.bf16(F::Norms, 1, H);
    Y.q_rows = int64_t(L.heads) * spec.head_dim;
    Y.k_rows = Y.v_rows = int64_t(L.kv_heads) * spec.head_dim;
    if (Y.sparse) {
      Y.iq_rows = int64_t(L.index_heads) * spec.index_dim;
      Y.ik_rows = spec.index_dim;  // one index-K vector shared by all groups: every rank has all of it
    }
    Y.qkv = P.fp8(F::AttnQkv, Y.q_rows + Y.k_rows + Y.v_rows + Y.iq_rows + Y.ik_rows, H);
    Y.q_norm = P.bf16(F::Norms, 1, spec.head_dim);
    Y.k_norm = P.bf16(F::Norms, 1, spec.head_dim);
    if (Y.sparse) {
      Y.iq_norm = P.bf16(F::Norms, 1, spec.index_dim);
      Y.ik_norm = P.bf16(F::Norms, 1, spec.index_dim);
    }
    Y.o = P.fp8(F::AttnO, H, Y.q_rows);
    Y.post_norm = P.bf16(F::Norms, 1, H);
    if (!Y.moe) {
      Y.dense_gate_up = P.bf16(F::DenseMlp, 2 * L.dense_inter, H);
      Y.dense_down = P.bf16(F::DenseMlp, H, L.dense_inter);
      continue;
    }
    const int E = spec.num_experts;
    if (opt.router_bf16)
      Y.router = P.bf16(F::Router, E, H);
    else
      Y.router = P.add(F::Router, DType::F32, E, H, f32_row_bytes(H));
    Y.router_bias = P.add(F::Router, DType::F32, 1, E, f32_row_bytes(E));
    Y.shared_in_slot = spec.shared_inter > 0 && spec.shared_inter == spec.moe_inter;
    Y.expert_slots = E + (Y.shared_in_slot ? 1 : 0);
    Y.w13 = P.mxfp4(F::Experts, Y.expert_slots, 2 * L.moe_inter, H);
    Y.w2 = P.mxfp4(F::Experts, Y.expert_slots, H, L.moe_inter);
    if (spec.shared_inter > 0 && !Y.shared_in_slot) {
      Y.shared_w13 = P.mxfp4(F::SharedExpert, 1, 2 * L.shared_inter, H);
      Y.shared_w2 = P.mxfp4(F::SharedExpert, 1, H, L.shared_inter);
    }
  }
  // the shared expert's slot inside the expert tensors is counted with the shared expert
  for (const auto& Y : L.layers)
    if (Y.shared_in_slot) {
      uint64_t b = Y.w13.codes.slot_bytes() + Y.w13.scales.slot_bytes() + Y.w2.codes.slot_bytes() +
                   Y.w2.scales.slot_bytes();
      P.fam[size_t(F::Experts)] -= b;
      P.fam[size_t(F::SharedExpert)] += b;
    }
  L.total_bytes = round_up(P.cur, kArenaAlign);
  L.family_bytes = P.fam;
  return L;
}

std::string PreparedLayout::describe_bytes() const {
  std::string s;
  for (size_t f = 0; f < family_bytes.size(); ++f)
    s += fmt::format("  {:<28} {:>12.3f} MiB\n", prepared_family_name(PreparedFamily(f)),
                     double(family_bytes[f]) / (1 << 20));
  s += fmt::format("  {:<28} {:>12.3f} MiB (rank {} of {})\n", "total (with alignment)", double(total_bytes) / (1 << 20),
                   opt.tp_rank, opt.tp_size);
  return s;
}

// ---------------------------------------------------------------------------------------------
// weight sources

namespace {

std::string key_str(const WeightKey& k) {
  std::string s = std::string(weight_role_name(k.role));
  if (k.layer >= 0) s = fmt::format("layer {} {}", k.layer, s);
  if (k.expert >= 0) s += fmt::format(" expert {}", k.expert);
  return s;
}

class HostSource final : public WeightSource {
 public:
  explicit HostSource(const ModelWeights& w) : w_(w) {}
  void read_rows(const WeightKey& k, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols,
                 float* out) const override {
    const WeightSlot slot = weight_slot(w_, k.role, k.layer, k.expert);
    const float* base = slot.data;
    const int64_t rows = slot.rows, cols = slot.cols;
    M3_CHECK(row0 >= 0 && nrows >= 0 && row0 + nrows <= rows && col0 >= 0 && ncols >= 0 && col0 + ncols <= cols,
             "weights: {}: rows [{}, {}) cols [{}, {}) outside its shape [{}, {}]", key_str(k), row0, row0 + nrows,
             col0, col0 + ncols, rows, cols);
    for (int64_t r = 0; r < nrows; ++r)
      std::memcpy(out + r * ncols, base + (row0 + r) * cols + col0, size_t(ncols) * 4);
  }

 private:
  const ModelWeights& w_;
};

class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const WeightBinding& b) {
    for (const auto& bw : b.weights)
      map_[std::make_tuple(int(bw.entry->role), bw.entry->layer, bw.entry->expert)] = &bw;
  }
  void read_rows(const WeightKey& k, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols,
                 float* out) const override {
    auto it = map_.find(std::make_tuple(int(k.role), k.layer, k.expert));
    M3_CHECK(it != map_.end(), "checkpoint: {} is not bound", key_str(k));
    read_rows_f32(*it->second, row0, nrows, col0, ncols, out);
  }
  bool read_mxfp4_row(const WeightKey& k, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                      uint8_t* scales) const override {
    const BoundWeight* bw = bound(k, WeightQuant::Mxfp4);
    if (!bw) return false;
    const BoundWeight& w = *bw;
    const int64_t rows = w.entry->shape[0], cols = w.entry->shape[1];
    if (col0 % kMxBlock != 0 || ncols % 2 != 0 || col0 < 0 || ncols < 0 || col0 + ncols > cols || row < 0 ||
        row >= rows)
      return false;
    const int64_t ld = (cols + 1) / 2, blocks = w.scale->shape[1], nb = (ncols + kMxBlock - 1) / kMxBlock;
    std::memcpy(codes, w.tensor->data + row * ld + col0 / 2, size_t(ncols / 2));
    const uint8_t* s = w.scale->data + row * blocks + col0 / kMxBlock;
    for (int64_t b = 0; b < nb; ++b) {
      M3_CHECK(s[b] != 0xff, "{}: scale '{}' is E8M0 255 (NaN) at row {}, block {} (columns {}..{}) of '{}'",
               w.scale->file, w.scale->name, row, col0 / kMxBlock + b, col0 + b * kMxBlock,
               col0 + b * kMxBlock + kMxBlock - 1, w.tensor->name);
      M3_CHECK(s[b] <= kMxfp4ArenaMaxScale,
               "{}: scale '{}' is E8M0 {} (2^{}) at row {}, block {} of '{}': the GPU expert kernels hold MXFP4 block "
               "scales up to 2^{} (weights up to {}; kernels/moe_mma.cuh)",
               w.scale->file, w.scale->name, int(s[b]), int(s[b]) - 127, row, col0 / kMxBlock + b, w.tensor->name,
               kMxfp4ArenaMaxScale - 127, 6 << (kMxfp4ArenaMaxScale - 127));
    }
    std::memcpy(scales, s, size_t(nb));
    return true;
  }
  bool read_mxfp8_row(const WeightKey& k, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                      uint8_t* scales) const override {
    const BoundWeight* bw = bound(k, WeightQuant::Mxfp8);
    if (!bw) return false;
    const BoundWeight& w = *bw;
    const int64_t rows = w.entry->shape[0], cols = w.entry->shape[1];
    if (col0 % kMxBlock != 0 || col0 < 0 || ncols < 0 || col0 + ncols > cols || row < 0 || row >= rows) return false;
    const int64_t blocks = w.scale->shape[1], nb = (ncols + kMxBlock - 1) / kMxBlock;
    const uint8_t* p = w.tensor->data + row * cols + col0;
    for (int64_t c = 0; c < ncols; ++c)
      M3_CHECK((p[c] & 0x7f) != 0x7f, "{}: tensor '{}' holds the E4M3 NaN code at row {}, column {}", w.tensor->file,
               w.tensor->name, row, col0 + c);
    const uint8_t* sc = w.scale->data + row * blocks + col0 / kMxBlock;
    for (int64_t b = 0; b < nb; ++b)
      M3_CHECK(sc[b] != 0xff, "{}: scale '{}' is E8M0 255 (NaN) at row {}, block {} (columns {}..{}) of '{}'",
               w.scale->file, w.scale->name, row, col0 / kMxBlock + b, col0 + b * kMxBlock,
               col0 + b * kMxBlock + kMxBlock - 1, w.tensor->name);
    std::memcpy(codes, p, size_t(ncols));
    std::memcpy(scales, sc, size_t(nb));
    return true;
  }
  bool read_fp8_row(const WeightKey& k, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                    float* scale) const override {
    const BoundWeight* bw = bound(k, WeightQuant::Fp8Tensor);
    if (!bw) return false;
    const BoundWeight& w = *bw;
    const int64_t rows = w.entry->shape[0], cols = w.entry->shape[1];
    if (col0 < 0 || ncols < 0 || col0 + ncols > cols || row < 0 || row >= rows) return false;
    std::memcpy(scale, w.scale->data, 4);
    M3_CHECK(std::isfinite(*scale) && *scale > 0, "{}: scale '{}' is {}, not a finite positive number",
             w.scale->file, w.scale->name, *scale);
    const uint8_t* p = w.tensor->data + row * cols + col0;
    for (int64_t c = 0; c < ncols; ++c)
      M3_CHECK((p[c] & 0x7f) != 0x7f, "{}: tensor '{}' holds the E4M3 NaN code at row {}, column {}", w.tensor->file,
               w.tensor->name, row, col0 + c);
    std::memcpy(codes, p, size_t(ncols));
    return true;
  }

 private:
  // the bound tensor of k when the file holds it in format q, else null
  const BoundWeight* bound(const WeightKey& k, WeightQuant q) const {
    auto it = map_.find(std::make_tuple(int(k.role), k.layer, k.expert));
    return it == map_.end() || it->second->quant != q ? nullptr : it->second;
  }
  std::map<std::tuple<int, int, int>, const BoundWeight*> map_;
};

}  // namespace

std::unique_ptr<WeightSource> make_weight_source(const ModelWeights& w) { return std::make_unique<HostSource>(w); }
std::unique_ptr<WeightSource> make_weight_source(const WeightBinding& b) {
  return std::make_unique<CheckpointSource>(b);
}

uint8_t* HostArenaSink::begin_chunk(uint64_t offset, size_t bytes) {
  M3_CHECK(offset + bytes <= bytes_.size() && bytes <= max_, "host arena: chunk [{}, {}) outside {} bytes", offset,
           offset + bytes, bytes_.size());
  return bytes_.data() + offset;
}

ArenaReader host_arena_reader(const std::vector<uint8_t>& bytes) {
  return [&bytes](uint64_t offset, uint64_t n, void* dst) {
    M3_CHECK(offset + n <= bytes.size(), "host arena: read [{}, {}) outside {} bytes", offset, offset + n,
             bytes.size());
    std::memcpy(dst, bytes.data() + offset, size_t(n));
  };
}

// ---------------------------------------------------------------------------------------------
// filling

namespace {

enum class Enc { BF16, F32, FP8, MXFP4, MXFP8 };

// One prepared tensor to produce: destination row g (slot * rows + r) reads source row
// map(slot, r) restricted to columns [col0, col0 + ncols).
struct Job {
  std::string name;
  Enc enc;
  PTensor main, scales;  // scales: FP8 / MXFP4 only
  int64_t col0 = 0;
  std::function<std::pair<WeightKey, int64_t>(int slot, int64_t row)> map;
};

void encode_row(Enc enc, const float* x, int64_t n, uint8_t* dst, int64_t row_bytes, uint8_t* scale_dst) {
  switch (enc) {
    case Enc::BF16: {
      std::memset(dst, 0, size_t(row_bytes));
      for (int64_t c = 0; c < n; ++c) {
        M3_CHECK(std::isfinite(x[c]), "non-finite weight {} at column {}", x[c], c);
        uint16_t h = f32_to_bf16(x[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
      return;
    }
    case Enc::F32:
      std::memset(dst, 0, size_t(row_bytes));
      for (int64_t c = 0; c < n; ++c) M3_CHECK(std::isfinite(x[c]), "non-finite weight {} at column {}", x[c], c);
      std::memcpy(dst, x, size_t(n) * 4);
      return;
    case Enc::FP8: {
      float s = quantize_fp8_row(x, n, dst);
      std::memcpy(scale_dst, &s, 4);
      return;
    }
    case Enc::MXFP4: quantize_mxfp4_row(x, n, dst, scale_dst); return;
    case Enc::MXFP8:
      std::memset(dst, 0, size_t(row_bytes));
      for (int64_t c = 0; c < n; ++c) M3_CHECK(std::isfinite(x[c]), "non-finite weight {} at column {}", x[c], c);
      quantize_mxfp8_row(x, n, dst, scale_dst);
      return;
  }
}

// An MXFP8 row's block scales within what the GPU kernels multiply exactly (kMxfp8ArenaMinScale ..
// kMxfp8ArenaMaxScale): a block of zero codes outside them takes 127 (its values stay zero), any
// other is refused naming the block.
void check_mxfp8_scales(const uint8_t* codes, int64_t n, uint8_t* scales) {
  for (int64_t b = 0; b * kMxBlock < n; ++b) {
    const int s = scales[b];
    if (s >= kMxfp8ArenaMinScale && s <= kMxfp8ArenaMaxScale) continue;
    bool zero = true;
    for (int64_t c = b * kMxBlock; c < std::min<int64_t>(n, (b + 1) * kMxBlock); ++c) zero = zero && (codes[c] & 0x7f) == 0;
    M3_CHECK(zero,
             "block {} (columns {}..{}) has the E8M0 scale {} (2^{}): the GPU projection kernels hold MXFP8 block "
             "scales 2^{} .. 2^{} (kernels/mma_params.h)",
             b, b * kMxBlock, std::min<int64_t>(n, (b + 1) * kMxBlock) - 1, s, s - 127, kMxfp8ArenaMinScale - 127,
             kMxfp8ArenaMaxScale - 127);
    scales[b] = 127;
  }
}

void run_job(const Job& j, const WeightSource& src, ArenaSink& sink, ThreadPool& pool, uint64_t& done,
             uint64_t total, const std::function<void(uint64_t, uint64_t)>& progress) {
  const PTensor& T = j.main;
  const int64_t rows_total = int64_t(T.slots) * T.rows;
  if (rows_total == 0) return;
  const bool scaled = j.enc == Enc::FP8 || j.enc == Enc::MXFP4 || j.enc == Enc::MXFP8;
  const int64_t srb = scaled ? j.scales.row_bytes : 0;
  // a tiled tensor goes in whole tiles: a chunk of 16k rows is the same byte range in either layout
  const int64_t unit = T.tiled ? kTileRows : 1;
  M3_CHECK(T.slots == 1 || !T.tiled, "prepare: {}: a tiled tensor has one slot", j.name);
  M3_CHECK(size_t(unit * T.row_bytes) <= sink.max_chunk(), "prepare: {}: {} rows of {} bytes exceed the staging window {}",
           j.name, unit, T.row_bytes, sink.max_chunk());
  const int64_t per_chunk = std::max<int64_t>(1, int64_t(sink.max_chunk()) / T.row_bytes / unit) * unit;
  std::vector<uint8_t> scale_buf, row_major;
  for (int64_t g0 = 0; g0 < rows_total; g0 += per_chunk) {
    const int64_t g1 = std::min(rows_total, g0 + per_chunk);
    const int64_t stored = T.tiled ? tiled_rows(g1 - g0) : g1 - g0;  // the last tile's padding rows too
    uint8_t* chunk = sink.begin_chunk(T.offset + uint64_t(g0) * uint64_t(T.row_bytes), size_t(stored * T.row_bytes));
    if (T.tiled) row_major.assign(size_t((g1 - g0) * T.row_bytes), 0);
    uint8_t* dst = T.tiled ? row_major.data() : chunk;  // rows are encoded row-major, then tiled
    scale_buf.assign(size_t((g1 - g0) * srb), 0);
    pool.parallel_for(
        g1 - g0,
        [&](int64_t b, int64_t e) {
          std::vector<float> row(size_t(T.cols));
          for (int64_t i = b; i < e; ++i) {
            const int64_t g = g0 + i;
            const int slot = int(g / T.rows);
            const int64_t r = g % T.rows;
            auto [key, srow] = j.map(slot, r);
            try {
              uint8_t* d = dst + i * T.row_bytes;
              if (j.enc == Enc::MXFP4) {  // MXFP4 in the source: its bytes as they are (never re-quantized)
                std::memset(d, 0, size_t(T.row_bytes));
                if (src.read_mxfp4_row(key, srow, j.col0, T.cols, d, scale_buf.data() + i * srb)) continue;
              }
              if (j.enc == Enc::MXFP8) {  // MXFP8 in the source: its bytes as they are
                std::memset(d, 0, size_t(T.row_bytes));
                if (src.read_mxfp8_row(key, srow, j.col0, T.cols, d, scale_buf.data() + i * srb)) {
                  check_mxfp8_scales(d, T.cols, scale_buf.data() + i * srb);
                  continue;
                }
              }
              if (j.enc == Enc::FP8) {  // FP8 per tensor in the source: its codes, the tensor scale per row
                std::memset(d, 0, size_t(T.row_bytes));
                float s = 0;
                if (src.read_fp8_row(key, srow, j.col0, T.cols, d, &s)) {
                  std::memcpy(scale_buf.data() + i * srb, &s, 4);
                  continue;
                }
              }
              src.read_rows(key, srow, 1, j.col0, T.cols, row.data());
              encode_row(j.enc, row.data(), T.cols, d, T.row_bytes, scaled ? scale_buf.data() + i * srb : nullptr);
              if (j.enc == Enc::MXFP8) check_mxfp8_scales(d, T.cols, scale_buf.data() + i * srb);
              if (j.enc == Enc::MXFP4)
                for (int64_t b = 0; b < srb; ++b)
                  M3_CHECK(scale_buf[size_t(i * srb + b)] <= kMxfp4ArenaMaxScale,
                           "block {} needs the E8M0 scale 2^{}: the GPU expert kernels hold MXFP4 block scales up "
                           "to 2^{} (weights up to {}; kernels/moe_mma.cuh)",
                           b, int(scale_buf[size_t(i * srb + b)]) - 127, kMxfp4ArenaMaxScale - 127,
                           6 << (kMxfp4ArenaMaxScale - 127));
            } catch (const Error& err) {
              M3_FAIL("prepare {}: row {} (source {} row {}): {}", j.name, g, key_str(key), srow, err.what());
            }
          }
        },
        std::max<int64_t>(1, 4096 / std::max<int64_t>(1, T.cols / 256)));
    if (T.tiled) tile_rows_to(row_major.data(), g1 - g0, T.row_bytes, chunk);
    sink.end_chunk();
    done += uint64_t(stored) * uint64_t(T.row_bytes);
    if (scaled) {
      uint8_t* sd = sink.begin_chunk(j.scales.offset + uint64_t(g0) * uint64_t(srb), scale_buf.size());
      std::memcpy(sd, scale_buf.data(), scale_buf.size());
      sink.end_chunk();
      done += scale_buf.size();
    }
    if (progress) progress(done, total);
  }
}

// Interleaved gate/up: destination row 2j = gate row j, 2j + 1 = up row j, of this rank's slice.
std::pair<WeightKey, int64_t> gate_up_row(WeightRole gate, WeightRole up, int layer, int expert, int64_t row0,
                                          int64_t r) {
  return {WeightKey{(r & 1) ? up : gate, layer, expert}, row0 + r / 2};
}

}  // namespace

PrepareOptions prepare_options_for(const WeightBinding& b, PrepareOptions opt) {
  // whether every weight of the roles `of` picks is MXFP8 (and there is one)
  auto all_mxfp8 = [&](bool (*of)(WeightRole)) {
    bool any = false, all = true;
    for (const auto& w : b.weights)
      if (of(w.entry->role)) {
        any = true;
        all = all && w.quant == WeightQuant::Mxfp8;
      }
    return any && all;
  };
  if (all_mxfp8(attention_linear)) opt.mxfp8_projections = true;
  if (all_mxfp8(expert_linear)) opt.mxfp8_experts = true;
  return opt;
}

PrepareOptions prepare_options_for(const std::string& model_dir, const ModelSpec& spec, PrepareOptions opt) {
  SafetensorsSet files = SafetensorsSet::open(model_dir);
  const WeightBinding b = bind_weights(build_checkpoint_table(spec, files, model_dir), files);
  return prepare_options_for(b, opt);
}

std::string arena_requantization_note(const WeightBinding& b, const PrepareOptions& opt) {
  // The arena's format by role (plan_prepared): attention projections row-scaled FP8 (MXFP8 under
  // opt.mxfp8_projections), experts MXFP4, dense layers and lm_head BF16, router FP32 (or BF16 by
  // option: the option's rounding is asked for, not counted here). A quantized weight goes in
  // exactly when the arena's format holds its values: FP8 per-tensor as FP8 codes + row scales,
  // MXFP8 projections and MXFP4 experts as stored, MXFP8 and MXFP4 values (a 3- or 1-bit mantissa
  // times a power of two) in BF16 or FP32, anything in FP32.
  std::map<std::string, int64_t> twice;
  for (const auto& w : b.weights) {
    if (w.quant == WeightQuant::Float) continue;  // a float checkpoint's first rounding is the design
    const WeightRole r = w.entry->role;
    const bool attn = attention_linear(r);
    const bool expert = expert_linear(r);
    const bool bf16 = r == WeightRole::DenseGate || r == WeightRole::DenseUp || r == WeightRole::DenseDown ||
                      r == WeightRole::LmHead;
    bool exact = true;
    if (attn) exact = opt.mxfp8_projections ? w.quant == WeightQuant::Mxfp8 : w.quant == WeightQuant::Fp8Tensor;
    else if (expert) exact = opt.mxfp8_experts ? w.quant == WeightQuant::Mxfp8 : w.quant == WeightQuant::Mxfp4;
    else if (bf16) exact = w.quant != WeightQuant::Fp8Tensor;
    if (!exact)
      ++twice[fmt::format("{} {}", weight_quant_name(w.quant),
                          attn ? "projections" : expert ? "experts" : "dense / lm_head")];
  }
  if (twice.empty()) return "";
  std::string what;
  for (const auto& [k, n] : twice) what += fmt::format("{}{} {}", what.empty() ? "" : ", ", n, k);
  return fmt::format("quantized weights rounded again into the GPU arena's formats ({} projections, "
                     "{} experts, BF16 dense layers), which the GPU kernels read instead of the checkpoint's: {}; "
                     "this checkpoint runs there on numbers close to its own, not equal to them",
                     opt.mxfp8_projections ? "MXFP8" : "row-scaled FP8", opt.mxfp8_experts ? "MXFP8" : "MXFP4", what);
}

void fill_prepared(const PreparedLayout& L, const WeightSource& src, ArenaSink& sink, ThreadPool& pool,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
  const ModelSpec& s = L.spec;
  const int rank = L.opt.tp_rank;
  std::vector<Job> jobs;
  auto whole = [](WeightRole role, int layer) {
    return [role, layer](int, int64_t r) { return std::make_pair(WeightKey{role, layer, -1}, r); };
  };
  auto vec_job = [&](std::string name, const PTensor& t, WeightRole role, int layer) {
    jobs.push_back(Job{std::move(name), Enc::BF16, t, {}, 0, whole(role, layer)});
  };
  jobs.push_back(Job{"embed", Enc::BF16, L.embed, {}, 0, whole(WeightRole::Embed, -1)});
  {
    const int64_t v0 = L.vocab_row0;
    jobs.push_back(Job{"lm_head", Enc::BF16, L.lm_head, {}, 0, [v0](int, int64_t r) {
                         return std::make_pair(WeightKey{WeightRole::LmHead, -1, -1}, v0 + r);
                       }});
  }
  vec_job("final_norm", L.final_norm, WeightRole::FinalNorm, -1);
  for (int l = 0; l < s.num_layers; ++l) {
    const PreparedLayerLayout& Y = L.layers[size_t(l)];
    const std::string P = fmt::format("layer {} ", l);
    vec_job(P + "input_norm", Y.input_norm, WeightRole::InputNorm, l);
    vec_job(P + "post_norm", Y.post_norm, WeightRole::PostNorm, l);
    vec_job(P + "q_norm", Y.q_norm, WeightRole::QNorm, l);
    vec_job(P + "k_norm", Y.k_norm, WeightRole::KNorm, l);
    if (Y.sparse) {
      vec_job(P + "index_q_norm", Y.iq_norm, WeightRole::IndexQNorm, l);
      vec_job(P + "index_k_norm", Y.ik_norm, WeightRole::IndexKNorm, l);
    }
    // fused q | k | v | iq | ik rows of this rank
    const int64_t qr = Y.q_rows, kr = Y.k_rows, vr = Y.v_rows, iqr = Y.iq_rows;
    const int64_t k0 = int64_t(L.kv_head0) * s.head_dim, iq0 = int64_t(L.kv_head0) * s.index_dim;
    const Enc proj = Y.qkv.mx() ? Enc::MXFP8 : Enc::FP8;
    jobs.push_back(Job{P + "qkv", proj, Y.qkv.codes, Y.qkv.scales, 0, [=](int, int64_t r) {
                         if (r < qr) return std::make_pair(WeightKey{WeightRole::Wq, l, -1}, rank * qr + r);
                         r -= qr;
                         if (r < kr) return std::make_pair(WeightKey{WeightRole::Wk, l, -1}, k0 + r);
                         r -= kr;
                         if (r < vr) return std::make_pair(WeightKey{WeightRole::Wv, l, -1}, k0 + r);
                         r -= vr;
                         if (r < iqr) return std::make_pair(WeightKey{WeightRole::IndexWq, l, -1}, iq0 + r);
                         r -= iqr;
                         return std::make_pair(WeightKey{WeightRole::IndexWk, l, -1}, r);
                       }});
    jobs.push_back(Job{P + "o", proj, Y.o.codes, Y.o.scales, rank * qr, whole(WeightRole::Wo, l)});
    if (!Y.moe) {
      const int64_t I = L.dense_inter;
      jobs.push_back(Job{P + "dense gate_up", Enc::BF16, Y.dense_gate_up, {}, 0, [=](int, int64_t r) {
                           return gate_up_row(WeightRole::DenseGate, WeightRole::DenseUp, l, -1, rank * I, r);
                         }});
      jobs.push_back(Job{P + "dense down", Enc::BF16, Y.dense_down, {}, rank * I, whole(WeightRole::DenseDown, l)});
      continue;
    }
    jobs.push_back(Job{P + "router", Y.router.dtype == DType::BF16 ? Enc::BF16 : Enc::F32, Y.router, {}, 0,
                       whole(WeightRole::Router, l)});
    jobs.push_back(Job{P + "router_bias", Enc::F32, Y.router_bias, {}, 0, whole(WeightRole::RouterBias, l)});
    const int E = s.num_experts;
    const int64_t I = L.moe_inter, S = L.shared_inter;
    const Enc ex = Y.w13.fp8() ? Enc::MXFP8 : Enc::MXFP4;
    jobs.push_back(Job{P + "experts w13", ex, Y.w13.codes, Y.w13.scales, 0, [=](int slot, int64_t r) {
                         if (slot == E) return gate_up_row(WeightRole::SharedGate, WeightRole::SharedUp, l, -1, rank * S, r);
                         return gate_up_row(WeightRole::ExpertGate, WeightRole::ExpertUp, l, slot, rank * I, r);
                       }});
    // w2 columns: this rank's slice of the (routed and, in slot E, shared: equal width) expert width
    jobs.push_back(Job{P + "experts w2", ex, Y.w2.codes, Y.w2.scales, rank * I, [=](int slot, int64_t r) {
                         if (slot == E) return std::make_pair(WeightKey{WeightRole::SharedDown, l, -1}, r);
                         return std::make_pair(WeightKey{WeightRole::ExpertDown, l, slot}, r);
                       }});
    if (!Y.shared_w13.codes.empty()) {
      jobs.push_back(Job{P + "shared w13", ex, Y.shared_w13.codes, Y.shared_w13.scales, 0, [=](int, int64_t r) {
                           return gate_up_row(WeightRole::SharedGate, WeightRole::SharedUp, l, -1, rank * S, r);
                         }});
      jobs.push_back(Job{P + "shared w2", ex, Y.shared_w2.codes, Y.shared_w2.scales, rank * S,
                         whole(WeightRole::SharedDown, l)});
    }
  }
  uint64_t total = 0, done = 0;
  for (const Job& j : jobs) total += j.main.bytes + j.scales.bytes;
  for (const Job& j : jobs) run_job(j, src, sink, pool, done, total, progress);
}

// ---------------------------------------------------------------------------------------------
// dequantizing back

namespace {

std::vector<uint8_t> fetch(const ArenaReader& rd, const PTensor& t, int slot = 0) {
  std::vector<uint8_t> b(size_t(t.slot_bytes()));
  if (!b.empty()) rd(t.offset + uint64_t(slot) * t.slot_bytes(), b.size(), b.data());
  return b;
}

Mat dq_bf16(const ArenaReader& rd, const PTensor& t) {
  auto b = fetch(rd, t);
  Mat m(int(t.rows), int(t.cols));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) {
      uint16_t h;
      std::memcpy(&h, b.data() + r * t.row_bytes + 2 * c, 2);
      m.row(int(r))[c] = bf16_to_f32(h);
    }
  return m;
}
Vec dq_vec(const ArenaReader& rd, const PTensor& t) { return dq_bf16(rd, t).data; }

Mat dq_f32(const ArenaReader& rd, const PTensor& t) {
  auto b = fetch(rd, t);
  Mat m(int(t.rows), int(t.cols));
  for (int64_t r = 0; r < t.rows; ++r) std::memcpy(m.row(int(r)), b.data() + r * t.row_bytes, size_t(t.cols) * 4);
  return m;
}

Mat dq_fp8(const ArenaReader& rd, const PFp8& q) {
  auto codes = fetch(rd, q.codes);
  if (q.codes.tiled) {
    std::vector<uint8_t> rows(codes.size());
    untile_rows_to(codes.data(), q.codes.rows, q.codes.row_bytes, rows.data());
    codes.swap(rows);
  }
  auto sb = fetch(rd, q.scales);
  Mat m(int(q.codes.rows), int(q.codes.cols));
  for (int64_t r = 0; r < q.codes.rows; ++r) {
    if (q.mx()) {
      dequantize_mxfp8_row(codes.data() + r * q.codes.row_bytes, sb.data() + r * q.scales.row_bytes, q.codes.cols,
                           m.row(int(r)));
      continue;
    }
    float s;
    std::memcpy(&s, sb.data() + 4 * r, 4);
    dequantize_fp8_row(codes.data() + r * q.codes.row_bytes, s, q.codes.cols, m.row(int(r)));
  }
  return m;
}

Mat dq_mxfp4(const ArenaReader& rd, const PMxfp4& q, int slot) {
  auto codes = fetch(rd, q.codes, slot);
  auto sb = fetch(rd, q.scales, slot);
  Mat m(int(q.codes.rows), int(q.codes.cols));
  for (int64_t r = 0; r < q.codes.rows; ++r)
    (q.fp8() ? dequantize_mxfp8_row : dequantize_mxfp4_row)(codes.data() + r * q.codes.row_bytes,
                                                             sb.data() + r * q.scales.row_bytes, q.codes.cols,
                                                             m.row(int(r)));
  return m;
}

Mat rows_of(const Mat& m, int64_t r0, int64_t n) {
  Mat o(int(n), m.cols);
  if (n > 0) std::memcpy(o.data.data(), m.row(int(r0)), size_t(n) * size_t(m.cols) * 4);
  return o;
}

// interleaved [2I, H] -> gate [I, H], up [I, H]
void deinterleave(const Mat& gu, Mat& gate, Mat& up) {
  const int I = gu.rows / 2;
  gate = Mat(I, gu.cols);
  up = Mat(I, gu.cols);
  for (int j = 0; j < I; ++j) {
    std::memcpy(gate.row(j), gu.row(2 * j), size_t(gu.cols) * 4);
    std::memcpy(up.row(j), gu.row(2 * j + 1), size_t(gu.cols) * 4);
  }
}

MlpWeights dq_expert(const ArenaReader& rd, const PMxfp4& w13, const PMxfp4& w2, int slot) {
  MlpWeights m;
  deinterleave(dq_mxfp4(rd, w13, slot), m.gate, m.up);
  m.down = dq_mxfp4(rd, w2, slot);
  return m;
}

}  // namespace

LayerWeights dequantize_prepared_layer(const PreparedLayout& L, int layer, const ArenaReader& rd,
                                       const std::vector<int>* experts) {
  M3_CHECK(layer >= 0 && layer < int(L.layers.size()), "dequantize_prepared_layer: layer {} out of range [0, {})",
           layer, L.layers.size());
  const PreparedLayerLayout& Y = L.layers[size_t(layer)];
  LayerWeights w;
  w.input_norm = dq_vec(rd, Y.input_norm);
  w.post_norm = dq_vec(rd, Y.post_norm);
  w.q_norm = dq_vec(rd, Y.q_norm);
  w.k_norm = dq_vec(rd, Y.k_norm);
  Mat qkv = dq_fp8(rd, Y.qkv);
  w.wq = rows_of(qkv, 0, Y.q_rows);
  w.wk = rows_of(qkv, Y.q_rows, Y.k_rows);
  w.wv = rows_of(qkv, Y.q_rows + Y.k_rows, Y.v_rows);
  if (Y.sparse) {
    w.wiq = rows_of(qkv, Y.q_rows + Y.k_rows + Y.v_rows, Y.iq_rows);
    w.wik = rows_of(qkv, Y.q_rows + Y.k_rows + Y.v_rows + Y.iq_rows, Y.ik_rows);
    w.iq_norm = dq_vec(rd, Y.iq_norm);
    w.ik_norm = dq_vec(rd, Y.ik_norm);
  }
  w.wo = dq_fp8(rd, Y.o);
  if (!Y.moe) {
    deinterleave(dq_bf16(rd, Y.dense_gate_up), w.dense.gate, w.dense.up);
    w.dense.down = dq_bf16(rd, Y.dense_down);
    return w;
  }
  w.router = Y.router.dtype == DType::BF16 ? dq_bf16(rd, Y.router) : dq_f32(rd, Y.router);
  w.router_bias = dq_f32(rd, Y.router_bias).data;
  const int E = L.spec.num_experts;
  w.experts.resize(size_t(E));
  if (experts) {
    for (int e : *experts) {
      M3_CHECK(e >= 0 && e < E, "dequantize_prepared_layer: expert {} out of range [0, {})", e, E);
      w.experts[size_t(e)] = dq_expert(rd, Y.w13, Y.w2, e);
    }
  } else {
    for (int e = 0; e < E; ++e) w.experts[size_t(e)] = dq_expert(rd, Y.w13, Y.w2, e);
  }
  if (Y.shared_in_slot)
    w.shared = dq_expert(rd, Y.w13, Y.w2, E);
  else if (!Y.shared_w13.codes.empty())
    w.shared = dq_expert(rd, Y.shared_w13, Y.shared_w2, 0);
  return w;
}

ModelWeights dequantize_prepared_model_only(const PreparedLayout& L, const ArenaReader& rd) {
  ModelWeights w;
  w.embed = dq_bf16(rd, L.embed);
  w.lm_head = dq_bf16(rd, L.lm_head);
  w.final_norm = dq_vec(rd, L.final_norm);
  return w;
}

ModelWeights dequantize_prepared(const PreparedLayout& L, const ArenaReader& rd) {
  ModelWeights w = dequantize_prepared_model_only(L, rd);
  for (int l = 0; l < int(L.layers.size()); ++l) w.layers.push_back(dequantize_prepared_layer(L, l, rd));
  return w;
}

}  // namespace m3
