// The CPU reference backend: the whole MiniMax-M3 text model in fp32, exactly as
// shared/docs/m3-model.md says, over a paged KV / index-K cache. The oracle of every test.
// Two options make it the oracle of the GPU path on the same weights without changing its math:
//   - cache: round what it writes into its K/V and index-K caches through the GPU's codec
//     (ref/cache_codec.h; default exact fp32, which conformance against transformers uses);
//   - step_following: take another backend's discrete choices of the same step where they are
//     near-ties in its own scores (ref/follow.h).
#pragma once
#include <functional>
#include <memory>

#include "model/weights.h"

namespace m3 {
class WeightSource;  // model/prepare.h
}
#include "ref/cache_codec.h"
#include "ref/ffn_tap.h"
#include "ref/follow.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace m3::ref {

struct RefOptions {
  RefOptions(int blocks = 256, int threads_ = 0) : num_cache_blocks(blocks), threads(threads_) {}
  int num_cache_blocks;  // blocks of spec.index_block tokens
  int threads;           // 0 = hardware concurrency
  CacheEmulation cache;  // default: exact fp32 caches
  FfnInputTap ffn_tap;   // sees every layer's FFN input each step (probes; default: none)
  // Tensor parallelism (model/tp_shard.h, docs/tensor-parallel.md): tp ranks as threads of this
  // process, each with its shard of the weights and of the caches and threads / tp pool threads;
  // all-reduces after attention and the FFN, logits gathered. The same math; only the order of the
  // sums over the split dimensions changes. step_following is one rank's only (tp 1).
  int tp = 1;
  // Ranks in other processes (an MPI job: runtime/mpi/mpi_communicator.h): this process is rank
  // comm->rank() of comm->size() == tp and computes only its shard; traces are gathered from every
  // rank. Null: the tp ranks are threads of this process.
  std::shared_ptr<Communicator> comm;
};

class RefBackend : public Backend {
 public:
  // step() that offers `decisions` (another backend's trace of this very step: same batch) to
  // follow under `opt`; stats accumulates what was followed and refused. The trace, when given,
  // receives the choices actually used.
  virtual StepOutput step_following(const StepBatch& batch, const SelectionTrace& decisions, const FollowOptions& opt,
                                    FollowStats* stats, SelectionTrace* trace = nullptr) = 0;
};

std::unique_ptr<RefBackend> make_ref_backend(ModelSpec spec, ModelWeights weights, RefOptions opt = {});
// The same from a weight source (model/prepare.h: a checkpoint's binding, or host weights): each
// rank (tp > 1) reads only its slices (model/tp_shard.h), so a rank of an MPI job never holds the
// whole model. `src` is only read during the call.
std::unique_ptr<RefBackend> make_ref_backend(ModelSpec spec, const WeightSource& src, RefOptions opt = {});
// The same from each rank's own weights (rank r's shapes: model/tp_shard.h), e.g. every rank's
// prepared arena dequantized (a rank's quantization of a split matrix is its own, so these are not
// slices of one full model); opt.tp ranks as threads (or this process's rank of opt.comm).
std::unique_ptr<RefBackend> make_ref_backend_from_ranks(ModelSpec spec,
                                                       const std::function<ModelWeights(int rank)>& rank_weights,
                                                       RefOptions opt);

}  // namespace m3::ref
