// The prepared weights on the device: ONE cudaMalloc holds every tensor of this rank at the offsets
// of its PreparedLayout (model/prepare.h), filled from a weight source through a small pinned
// staging window (no second full host copy), with typed views for the kernels. Both the native
// and the mono path read these tensors; nothing else allocates weight memory.
#pragma once
#include <cuda_runtime.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "model/prepare.h"
#include "model/prepared_tensors.h"
#include "native/linear.h"
#include "native/moe.h"

namespace m3::native {

struct PrepareLoadOptions {
  bool progress = true;                 // progress bar and per-family byte table on stderr
  size_t staging_bytes = size_t(64) << 20;  // two windows of half this size
  int threads = 0;                      // quantization threads (0: all cores)
};

struct LayerNormWeights {  // BF16 vectors (iq / ik: sparse layers only, else null)
  const uint16_t* input = nullptr;
  const uint16_t* post = nullptr;
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* iq = nullptr;
  const uint16_t* ik = nullptr;
};

// Where an arena's tensors are: base + offset (one allocation of the layout), or, for an arena
// BORROWED tensor by tensor (a host framework's device buffers, issue 16), each tensor's own buffer,
// found by its offset in the layout. Empty tensors are null.
class ArenaAddr {
 public:
  ArenaAddr(const uint8_t* base) : base_(base) {}  // NOLINT: a base address is an arena's address
  struct Borrowed {
    uint64_t offset = 0, bytes = 0;  // the tensor's place in the layout
    const uint8_t* data = nullptr;   // its buffer
  };
  explicit ArenaAddr(std::vector<Borrowed> tensors);  // every non-empty tensor
  const uint8_t* operator()(const PTensor& t) const;
  // The address of layout bytes [offset, offset + n), which must lie in one tensor.
  const uint8_t* range(uint64_t offset, uint64_t n) const;
  bool borrowed() const { return base_ == nullptr; }

 private:
  const uint8_t* base_ = nullptr;
  std::vector<Borrowed> at_;  // sorted by offset, not overlapping
};

// Typed views into one arena (its addresses + its layout). PreparedWeights uses them, and so does
// anything else that owns an arena of the same layout (the bench fills one on the device).
Fp8Weight arena_fp8_view(const ArenaAddr& at, const PFp8& m);
MoeWeights arena_moe_view(const ArenaAddr& at, const PreparedLayout& layout, int layer);

class PreparedWeights {
 public:
  // Plans, allocates (one cudaMalloc on the current device) and fills from `src`.
  static std::unique_ptr<PreparedWeights> create(const ModelSpec& spec, const WeightSource& src,
                                                 const PrepareOptions& opt = {}, const PrepareLoadOptions& lo = {});
  // Allocates the arena of `layout` (one cudaMalloc on the current device, zeroed so row padding
  // stays zero) and lets fill(base, stream) write its tensors on the device: no weight source, no
  // host quantization, no host copy (the benchmarks fill real-size arenas with random values this
  // way, bench/cuda/device_weights.h). Returns once the fill has completed on `stream`.
  static std::unique_ptr<PreparedWeights> create_on_device(const PreparedLayout& layout,
                                                           const std::function<void(uint8_t*, cudaStream_t)>& fill,
                                                           cudaStream_t stream = nullptr);
  // From a checkpoint directory (config.json + safetensors, through the weight table).
  static std::unique_ptr<PreparedWeights> load(const std::filesystem::path& model_dir, const PrepareOptions& opt = {},
                                               const PrepareLoadOptions& lo = {});
  // BORROWS the tensors of `layout` from device buffers the caller owns (a host framework's; issue
  // 16's library level): tensors[i] = (the tensor's spec: model/prepared_tensors.h, its buffer,
  // already checked with check_borrowed). Every tensor of every layer and of the model must be
  // there, once; nothing is allocated, copied or converted, and the buffers must outlive this.
  static std::unique_ptr<PreparedWeights> borrow(const PreparedLayout& layout,
                                                 const std::vector<std::pair<TensorSpec, const void*>>& tensors);
  ~PreparedWeights();
  PreparedWeights(const PreparedWeights&) = delete;
  PreparedWeights& operator=(const PreparedWeights&) = delete;

  const PreparedLayout& layout() const { return layout_; }
  const ModelSpec& spec() const { return layout_.spec; }
  const uint8_t* device_base() const { return base_; }  // null when borrowed
  bool borrowed() const { return at_.borrowed(); }
  uint64_t device_bytes() const { return layout_.total_bytes; }
  ArenaReader reader() const;  // device-to-host copies

  // views
  Fp8Weight qkv(int layer) const;
  Fp8Weight o(int layer) const;
  LayerNormWeights norms(int layer) const;
  DenseWeight dense_gate_up(int layer) const;
  DenseWeight dense_down(int layer) const;
  MoeWeights moe(int layer) const;
  DenseWeight embed() const;
  DenseWeight lm_head() const;  // this rank's vocab rows [layout().vocab_row0, + vocab_rows)
  const uint16_t* final_norm() const;

 private:
  PreparedWeights() = default;
  const uint8_t* at(const PTensor& t) const { return at_(t); }
  const PreparedLayerLayout& layer(int l) const;
  PreparedLayout layout_;
  uint8_t* base_ = nullptr;  // the owned arena (null when borrowed)
  ArenaAddr at_{nullptr};
};

}  // namespace m3::native
