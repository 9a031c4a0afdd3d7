// The CUDA native backend: the whole MiniMax-M3 text model on one GPU, one kernel per operation,
// for any batch shape (prefill, chunked prefill, mixed prefill + decode, decode of any size), over
// the prepared weight arena (native/prepared.h) and paged FP8/BF16 caches (native/kv_cache.h).
//
// Forward of one pass of T token rows (native/layer_plan.cpp):
//   embedding -> per layer [RMSNorm(+residual) -> fused FP8 q|k|v|iq|ik projection -> q/k norm +
//   RoPE + cache insert -> (sparse layers: indexer) -> attention -> FP8 O projection ->
//   RMSNorm + residual -> dense MLP or router + MoE (+ shared expert)] -> final norm -> lm_head.
// Every buffer is allocated once for `max_tokens` rows; steps with more tokens run in chunks
// (per-token causal math makes chunking exact).
//
// Decode steps (every sequence adds one token, at most max_graph_batch sequences, no trace) and
// verify steps (every sequence adds the same 2 .. 4 tokens: native/bucket_rows.h) run at a fixed
// padded shape: the batch is padded up to a bucket of 1, 2, 4, ..., 64 request rows of q tokens
// (padding rows have slot -1: they write no cache, their logits are dropped), block tables are
// padded to a fixed width and launches are sized for max_model_len, so the step is the same
// sequence of launches whatever the contexts are. That sequence is captured once per token-row
// count as a CUDA graph and replayed after the step's metadata is copied into fixed-address device
// buffers; with graphs off the same launches run eagerly, so eager and replayed results are
// bitwise equal.
//
// Sampling (SeqStep::sample): native/sampling.h over the device logits rows right after each
// lm_head (eagerly, after a graph's replay; never captured), tokens back to the host; the logits
// copy is skipped when every sequence of the step samples and none wants logits.
//
// The forward itself is data (native/forward.h, native/layer_plan.h): a plan of op calls per pass,
// built once per decode bucket; the sparse layer range runs through the plan or, per step, through
// a registered LayerRangeRunner (native/layer_range.h: the mono path's seam).
//
// Plain C++ header (no CUDA include), so host code can hold a backend; built only with CUDA.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "native/bucket_rows.h"
#include "native/launch.h"
#include "runtime/backend.h"
#include "runtime/dispatcher.h"

// Same declaration as CUDA's driver_types.h, so this header needs no CUDA include.
typedef struct CUstream_st* cudaStream_t;

namespace m3::native {

class PreparedWeights;
class DeviceKvCache;
class LayerRangeRunner;
class ForwardModel;
class DeviceComm;

struct CudaBackendOptions {
  int num_cache_blocks = 256;  // blocks of spec.index_block tokens
  int max_tokens = 2048;       // rows of one forward pass; larger steps run in chunks
  int max_model_len = 0;       // longest sequence (0: min(max_positions, num_cache_blocks * block))
  DType kv_dtype = DType::F8_E4M3;  // main K/V cache: F8_E4M3 or BF16
  DType ik_dtype = DType::F8_E4M3;  // index-K cache: F8_E4M3 or BF16
  float k_scale = 1, v_scale = 1, ik_scale = 1;  // FP8 cache scales (every layer)
  bool cuda_graphs = true;     // replay captured graphs for decode buckets
  int max_graph_batch = 64;    // largest decode bucket (a power of two, <= max_tokens)
  int logits_rows = 256;       // lm_head rows per pass (more output rows run in passes)
  int device = -1;             // CUDA device (-1: the current one)
  bool pdl = pdl_default();    // programmatic dependent launch for every op (native/launch.h: on unless M3_PDL=0)
  // Tensor parallelism: this rank's collectives (native/device_comm.h); the weights are then the
  // arena of rank comm->rank() of comm->size(). A comm that cannot be captured turns graphs off.
  std::shared_ptr<DeviceComm> comm;
};

struct CudaBackendStats {
  int64_t steps = 0, eager_passes = 0, bucket_steps = 0, graph_replays = 0, graph_captures = 0;
};

// Optional test/debug hook: the indexer's max-pooled block scores of the last traced step, for
// each sparse layer (as in SelectionTrace), token and group, blocks 0 .. pos / block_size.
struct BlockScoreTrace {
  std::vector<int> layers;
  std::vector<std::vector<std::vector<std::vector<float>>>> scores;  // [sparse layer][token][group][block]
};

class CudaBackend : public Backend {
 public:
  ~CudaBackend() override = default;
  // The cache pool (tests read or poison it).
  virtual DeviceKvCache& kv_cache() = 0;
  virtual const CudaBackendOptions& options() const = 0;
  virtual CudaBackendStats stats() const = 0;
  // When set, traced steps also fill *scores (nullptr turns it off).
  virtual void set_block_score_trace(BlockScoreTrace* scores) = 0;

  // Registers a runner of the sparse layer range (the mono path), tried before native on every
  // step (runtime/dispatcher.h): a step it accepts runs its sparse layers through it, any other
  // runs them natively. Steps with a SelectionTrace always run natively ("traced").
  virtual void add_layer_range_runner(std::unique_ptr<LayerRangeRunner> runner) = 0;
  // Steps per path and fallbacks per reason so far.
  virtual const Dispatcher& dispatcher() const = 0;
  // The forward's model views (weights, caches, numerics constants): what a runner reads.
  virtual const ForwardModel& model() const = 0;
  // Sets every byte of the fused ops' arrival counters (Activations::route_arrivals, rope_arrivals,
  // combine_arrivals)
  // to `byte`, as a kernel stopped inside one of those ops would leave them (tests: a step after a
  // mono fault must not inherit them).
  virtual void set_arrival_counters(uint8_t byte) = 0;
};

// The weights are shared (tests dequantize them for the CPU reference). Checks that the arena is
// the shard of opt.comm's rank (a single-rank layout without a comm) of a model the kernels support.
std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const PreparedWeights> weights,
                                               const CudaBackendOptions& opt = {});
// The same over a cache pool the caller owns and keeps alive (its shape must be the spec's cache
// shape with opt.kv_dtype / opt.ik_dtype; its block count replaces opt.num_cache_blocks). The
// benchmarks run every path on one random-filled cache this way.
std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const PreparedWeights> weights,
                                               const CudaBackendOptions& opt, DeviceKvCache* borrowed_cache);

// True when the CUDA runtime sees at least one device (never throws).
bool cuda_device_available();

}  // namespace m3::native
