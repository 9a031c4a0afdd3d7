// The prepared weight store, host side: where every prepared tensor of one tensor-parallel rank
// lives inside ONE arena (plan_prepared), how the arena is filled from a weight source row by row
// through a small staging window (fill_prepared), and how it is dequantized back into fp32
// ModelWeights / LayerWeights so the CPU reference computes with the same numbers as the GPU
// (dequantize_prepared*). The device arena itself (one cudaMalloc) is native/prepared.h; byte
// layouts are documented in docs/formats.md.
//
// Formats (design.md "Prepared weight formats"):
//   attention q|k|v|index_q|index_k fused into one FP8 E4M3 matrix, one fp32 scale per row; O the same;
//   routed experts and the shared expert MXFP4, gate/up rows interleaved (row 2j = gate j,
//   row 2j+1 = up j) so one pass reads both; the shared expert is slot `num_experts` of the expert
//   tensors when its width equals the routed width, else its own tensors;
//   router FP32 (or BF16 by option), correction bias FP32; embeddings, lm_head, norms and the
//   dense MLPs BF16 (dense gate/up interleaved the same way).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/weight_tiles.h"
#include "model/spec.h"
#include "model/weight_table.h"
#include "model/weights.h"

namespace m3 {

inline constexpr uint64_t kArenaAlign = 256;  // every tensor starts on a 256-byte boundary

struct PrepareOptions {
  int tp_rank = 0, tp_size = 1;  // this rank's shard (tensor parallelism)
  bool router_bf16 = false;      // store the router weight BF16 (logits, sigmoid, bias stay fp32)
  bool fp8_tiled = true;         // FP8 projection codes in 16-row tiles (core/weight_tiles.h), else row-major
  // attention projections MXFP8 (E4M3 codes + one E8M0 scale per 32 columns: the MXFP8 release's
  // bytes as stored) instead of row-scaled FP8; prepare_options_for turns it on for such checkpoints
  bool mxfp8_projections = false;
  // routed and shared experts MXFP8 (E4M3 codes, one byte an element, + E8M0 per 32) instead of
  // MXFP4: the MXFP8 release's expert bytes as stored (twice MXFP4's; mono refuses them)
  bool mxfp8_experts = false;
};

enum class PreparedFamily : uint8_t {
  AttnQkv, AttnO, Norms, DenseMlp, Router, Experts, SharedExpert, Embed, LmHead, Count
};
std::string_view prepared_family_name(PreparedFamily f);

// One stored tensor: `rows` rows of `row_bytes` bytes each (rows padded to 16-byte multiples),
// times `slots` for stacked experts. dtype: F8_E4M3 / E2M1x2 / E8M0 / BF16 / F32. Tiled (the FP8
// projection codes, one slot): row_bytes a multiple of 64, tiled_rows(rows) rows stored in the
// layout of core/weight_tiles.h (16-row tiles, block-major; the padding rows zero).
struct PTensor {
  uint64_t offset = 0;     // from the arena start
  uint64_t bytes = 0;      // slots * rows * row_bytes
  DType dtype = DType::U8;
  int64_t rows = 0, cols = 0;  // logical elements of one slot
  int64_t row_bytes = 0;
  int slots = 1;
  bool tiled = false;
  uint64_t slot_bytes() const { return uint64_t(tiled ? tiled_rows(rows) : rows) * uint64_t(row_bytes); }
  bool empty() const { return bytes == 0; }
};

// FP8 E4M3 codes [rows, row_bytes] (tiled or row-major) + fp32 scales [rows]; MXFP8 (opt.
// mxfp8_projections): the scales E8M0 [rows][ceil(cols / 32)], byte j of a row scaling columns
// 32j .. 32j + 31 by 2^(byte - 127), bytes kMxfp8ArenaMinScale .. kMxfp8ArenaMaxScale only.
struct PFp8 {
  PTensor codes, scales;
  bool mx() const { return scales.dtype == DType::E8M0; }
};
// The E8M0 block scales the GPU projection kernels multiply exactly (kernels/mma_params.h): a block
// outside them is refused when filling the arena, unless all its codes are zero (then stored as 127).
inline constexpr int kMxfp8ArenaMinScale = 4, kMxfp8ArenaMaxScale = 134;
// E2M1x2 codes [slots][rows][row_bytes] + E8M0 scales [slots][rows][cols/32]; MXFP8 experts
// (opt.mxfp8_experts): E4M3 codes, row_bytes = round_up(cols, 32), the same scales.
struct PMxfp4 {
  PTensor codes, scales;
  bool fp8() const { return codes.dtype == DType::F8_E4M3; }
};

struct PreparedLayerLayout {
  bool sparse = false, moe = false;
  PTensor input_norm, post_norm, q_norm, k_norm, iq_norm, ik_norm;  // BF16 vectors (iq/ik: sparse only)
  PFp8 qkv;                       // rows q | k | v | iq | ik of this rank, cols hidden
  int64_t q_rows = 0, k_rows = 0, v_rows = 0, iq_rows = 0, ik_rows = 0;
  PFp8 o;                         // [hidden, q_rows]
  PTensor dense_gate_up, dense_down;  // BF16 [2*I_rank, hidden] interleaved, [hidden, I_rank]
  PTensor router, router_bias;    // F32|BF16 [E, hidden], F32 [E]
  PMxfp4 w13, w2;                 // experts: [slots][2*I_rank, hidden], [slots][hidden, I_rank]
  int expert_slots = 0;           // num_experts, +1 when the shared expert is slot num_experts
  bool shared_in_slot = false;
  PMxfp4 shared_w13, shared_w2;   // shared expert when its width differs from the routed one
};

struct PreparedLayout {
  ModelSpec spec;
  PrepareOptions opt;
  // per-rank sizes
  int heads = 0, kv_heads = 0, index_heads = 0;
  int kv_head0 = 0;  // this rank's first KV head (model/tp_shard.h: split, or replicated past the heads)
  int64_t dense_inter = 0, moe_inter = 0, shared_inter = 0, vocab_rows = 0, vocab_row0 = 0;
  PTensor embed, lm_head, final_norm;  // BF16 [V, H] (replicated), [vocab_rows, H], [H]
  std::vector<PreparedLayerLayout> layers;
  uint64_t total_bytes = 0;
  std::array<uint64_t, size_t(PreparedFamily::Count)> family_bytes{};
  // "attention q/k/v fp8: 1.2 GiB\n..." one line per family and the total
  std::string describe_bytes() const;
};

// Throws (naming the field) when the spec cannot be split over opt.tp_size ranks.
PreparedLayout plan_prepared(const ModelSpec& spec, const PrepareOptions& opt = {});

// The shapes the layout's rank computes with (model/tp_shard.h tp_rank_spec; the model's at one
// rank). Throws naming `what` unless the layout is rank `rank` of `size` (the communicator's).
ModelSpec prepared_rank_spec(const PreparedLayout& layout, int rank, int size, const char* what);

// A model's weights as a row source: rows [row0, row0 + nrows) of one tensor, columns
// [col0, col0 + ncols), converted to fp32 into out (row-major, ncols per row). Vectors are one row.
// Must be callable from several threads at once.
struct WeightKey {
  WeightRole role;
  int layer = -1, expert = -1;
};
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual void read_rows(const WeightKey& key, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols,
                         float* out) const = 0;
  // Row `row` of a tensor the source holds in MXFP4, columns [col0, col0 + ncols) exactly as stored:
  // ceil(ncols / 2) bytes of packed codes (element 2j in the low nibble) and ceil(ncols / 32) E8M0
  // scales. Only for col0 a multiple of 32 and ncols even; false when the source cannot (then the
  // caller quantizes the fp32 row, which gives the same bytes for values MXFP4 holds exactly).
  virtual bool read_mxfp4_row(const WeightKey& key, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                              uint8_t* scales) const {
    (void)key, (void)row, (void)col0, (void)ncols, (void)codes, (void)scales;
    return false;
  }
  // Row `row` of a tensor the source holds in MXFP8, columns [col0, col0 + ncols) exactly as stored:
  // ncols E4M3 codes and ceil(ncols / 32) E8M0 scales. Only for col0 a multiple of 32; false when the
  // source cannot (then the caller quantizes the fp32 row).
  virtual bool read_mxfp8_row(const WeightKey& key, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                              uint8_t* scales) const {
    (void)key, (void)row, (void)col0, (void)ncols, (void)codes, (void)scales;
    return false;
  }
  // Row `row` of a tensor the source holds in FP8 E4M3 with one scale for the whole tensor: the
  // codes of columns [col0, col0 + ncols) as stored, and the scale. False when the source cannot.
  virtual bool read_fp8_row(const WeightKey& key, int64_t row, int64_t col0, int64_t ncols, uint8_t* codes,
                            float* scale) const {
    (void)key, (void)row, (void)col0, (void)ncols, (void)codes, (void)scale;
    return false;
  }
};
// Host fp32 weights (kept by reference; must outlive the source).
std::unique_ptr<WeightSource> make_weight_source(const ModelWeights& w);
// A bound checkpoint (memory-mapped tensors in any format bind_weights accepts), read in place; its
// MXFP4 tensors are also handed out as stored (read_mxfp4_row), so the arena holds the file's bytes.
std::unique_ptr<WeightSource> make_weight_source(const WeightBinding& b);

// `opt` with mxfp8_projections on when every attention linear of the checkpoint (q, k, v, o,
// index_q, index_k) is MXFP8, and mxfp8_experts when every routed and shared expert linear is: the
// arena then holds their codes and block scales as stored.
PrepareOptions prepare_options_for(const WeightBinding& b, PrepareOptions opt);
// The same for a checkpoint directory (its headers bound; no weight read).
PrepareOptions prepare_options_for(const std::string& model_dir, const ModelSpec& spec, PrepareOptions opt);

// What filling the arena from this checkpoint rounds a second time (quantized weights whose values
// the arena's format for their role cannot hold), or "" when nothing: MXFP4 experts and FP8
// per-tensor projections go in as stored (the latter with the tensor's scale on each row), MXFP8
// projections too under prepare_options_for's options, MXFP8 and MXFP4 values into BF16 dense
// layers exactly; MXFP4 projections, MXFP8 / FP8 experts and FP8 per-tensor dense layers are
// rounded again. The GPU loader prints it: such a checkpoint then runs on
// numbers close to, not equal to, its own.
std::string arena_requantization_note(const WeightBinding& b, const PrepareOptions& opt);

// The largest E8M0 byte of an MXFP4 block scale the GPU expert kernels multiply exactly (2^1:
// kernels/moe_mma.cuh); filling the arena refuses larger ones, naming the tensor and block.
inline constexpr int kMxfp4ArenaMaxScale = 128;

// Where fill_prepared writes: begin_chunk hands out a writable window for [offset, offset + bytes)
// of the arena (bytes <= max_chunk()), filled by several threads, then end_chunk commits it.
class ArenaSink {
 public:
  virtual ~ArenaSink() = default;
  virtual size_t max_chunk() const = 0;
  virtual uint8_t* begin_chunk(uint64_t offset, size_t bytes) = 0;
  virtual void end_chunk() = 0;
};
// A host arena (tests, tools): writes straight into `bytes` (resized to the layout's total).
class HostArenaSink : public ArenaSink {
 public:
  explicit HostArenaSink(std::vector<uint8_t>& bytes, size_t max_chunk = size_t(16) << 20)
      : bytes_(bytes), max_(max_chunk) {}
  size_t max_chunk() const override { return max_; }
  uint8_t* begin_chunk(uint64_t offset, size_t bytes) override;
  void end_chunk() override {}

 private:
  std::vector<uint8_t>& bytes_;
  size_t max_;
};

// Quantizes / converts every tensor of `layout` from `src` into `sink`, row chunks in parallel on
// `pool`. progress(done_bytes, total_bytes) after each chunk. Errors name the tensor and row.
void fill_prepared(const PreparedLayout& layout, const WeightSource& src, ArenaSink& sink, ThreadPool& pool,
                   const std::function<void(uint64_t, uint64_t)>& progress = {});

// Reads `bytes` bytes at `offset` of the arena into dst (a host copy or a device-to-host copy).
using ArenaReader = std::function<void(uint64_t offset, uint64_t bytes, void* dst)>;
ArenaReader host_arena_reader(const std::vector<uint8_t>& bytes);

// One layer's prepared weights as fp32 LayerWeights with this rank's shapes (wq [q_rows, H], ...;
// at tp_size 1 the model's own shapes). experts: which routed experts to dequantize (nullptr =
// all; the others are left empty); the shared expert is always filled.
LayerWeights dequantize_prepared_layer(const PreparedLayout& layout, int layer, const ArenaReader& read,
                                       const std::vector<int>* experts = nullptr);
// The whole model (every layer, embeddings, lm_head rows of this rank, final norm).
ModelWeights dequantize_prepared(const PreparedLayout& layout, const ArenaReader& read);
// Only the embeddings, lm_head rows and final norm (layers left empty).
ModelWeights dequantize_prepared_model_only(const PreparedLayout& layout, const ArenaReader& read);

}  // namespace m3
