// The hook between the benchmark harness and an execution path ("stream" here; the native
// forward and the mono path plug in the same way). A path is a StepRunner: for one case it sets up
// its per-step state, then enqueues one whole step on a stream, capturably; the harness captures
// that into a CUDA graph, replays it (median / p90 over >= 100 replays after warm-up), and, for
// the per-op breakdown, captures it again with an OpRecorder that drops a timing event before
// each op. Every path of a run sees the same StepEnv: the same random prepared weights and the
// same caches, so their times are comparable and their ratios meaningful.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_case.h"
#include "bench/step_bytes.h"
#include "model/prepare.h"
#include "mono/mono.h"
#include "native/kv_cache.h"

namespace m3::native {
class PreparedWeights;
}

namespace m3::bench {

// Called by a runner before each op of the step (op names as in step_bytes.h: "qkv", "kv",
// "experts", ...; a path may add its own, e.g. "attention"); layer -1 outside the layers.
class OpRecorder {
 public:
  virtual ~OpRecorder() = default;
  virtual void mark(cudaStream_t s, const char* op, int layer) = 0;
};

struct StepEnv {
  const ModelSpec* spec = nullptr;        // the measured (shard) spec; tensor parallel size 1
  const PreparedLayout* layout = nullptr; // plan_prepared(*spec, {router_bf16}) 
  uint8_t* arena = nullptr;               // device, layout->total_bytes of random prepared weights
  std::shared_ptr<const native::PreparedWeights> weights;  // the same arena as prepared weights (native)
  native::DeviceKvCache* cache = nullptr; // random contents; blocks enough for the largest case
  StepBytesOptions bytes_opt;             // cache dtypes
  uint64_t seed = 1;
  // The largest case of the run (0: unknown; a path that sizes buffers once uses the cache's size):
  int64_t max_len = 0;     // longest causal length (BenchCase::max_len)
  int max_batch = 0;       // most decode rows
  int64_t max_prefill = 0; // longest prefill
  std::string trace;       // BenchOptions::trace
  std::vector<int> aux_layers;  // BenchOptions::aux_layers
};

// Block tables of a case: decode row r (prefill: the one request, r = 0) owns the physical
// blocks [r * W, (r + 1) * W), W = ceil(max_len / block_size), so token t of row r sits at slot
// r * W * block_size + t.
int blocks_per_row(const BenchCase& c, int block_size);
std::vector<int32_t> row_block_table(const BenchCase& c, int block_size, int row);

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual std::string name() const = 0;
  // Prepares case c (metadata, scratch, routing inputs) and runs the step once eagerly, so every
  // lazy allocation happens here, never during capture.
  virtual void setup(const BenchCase& c, cudaStream_t s) = 0;
  // Enqueues one step on s (capturable). rec (may be null) is called before each op.
  virtual void enqueue(cudaStream_t s, OpRecorder* rec) = 0;
  // False when the step of the case set up last cannot be captured (the native prefill: eager
  // passes with host synchronization); the harness then times run_eager() with events on s.
  virtual bool capturable() const { return true; }
  // Runs one step now, ordered after the work on s and with s waiting for its end (events on s
  // around the call time it). rec as in enqueue. Default: enqueue.
  virtual void run_eager(cudaStream_t s, OpRecorder* rec) { enqueue(s, rec); }
  // Ops this path runs as one that the accounting splits: (path op, accounting ops), e.g. the
  // native "moe" = router + experts + shared_expert. The per-op table merges those rows.
  virtual std::vector<std::pair<std::string, std::vector<std::string>>> op_groups() const { return {}; }
  // After the timed steps: "" when the path's outputs are sane (or it has none), else what is wrong.
  virtual std::string check_outputs() { return ""; }
  // Distinct routed experts per model layer read by the last step (empty: unknown; the case's
  // bytes then use the expected-random model).
  virtual std::vector<double> experts_hit() const { return {}; }
  // Bytes this path reads when it differs from the case accounting (0: not known / the same).
  virtual double path_bytes() const { return 0; }
  virtual std::string note() const { return ""; }
};

using StepRunnerFactory = std::function<std::unique_ptr<StepRunner>(const StepEnv&)>;
// Paths by name: register_builtin_paths() registers "stream", "flat", "native" and "mono"; a name
// "mono:key=value/..." is mono with those options (mono/options.h), e.g. "mono:reserve=4".
void register_step_path(const std::string& name, StepRunnerFactory f);
std::vector<std::string> step_path_names();
StepRunnerFactory step_path(const std::string& name);  // throws listing the known names
void register_builtin_paths();

// The "stream" path: a plain cold read of exactly the bytes of the step's accounting
// (step_ops regions), one launch per op, in step order. Its time is the empirical floor
// of a step issued as separate kernels (each starts cold and ramps up).
std::unique_ptr<StepRunner> make_stream_runner(const StepEnv& env);
// The "flat" path: the same bytes in two launches, the sparse layer range's in one (flat_sparse: the
// best a fused sparse range can do, mono's yardstick) and the rest in the other (flat_other).

// The "native" path: the native forward (native/forward.h) over env.weights and env.cache, the
// plans CudaBackend executes (native_runner.cpp). Decode: the bucket plan (what CudaBackend replays
// as its decode graph: layers, final norm, lm_head into device logits; not the metadata upload nor
// the logits copy to the host), captured and replayed by the harness like any path, over the random
// cache as history. Prefill: one eager pass of T rows (not capturable). experts_hit() counts the
// router's actual choices.
std::unique_ptr<StepRunner> make_native_runner(const StepEnv& env);
// The "mono" path: the same forward with mono (src/mono) running the sparse layers of decode
// cases (prefill cases run natively); the set-up step is checked bitwise against native's.
std::unique_ptr<StepRunner> make_mono_runner(const StepEnv& env, const mono::MonoOptions& opt, const std::string& name);

}  // namespace m3::bench
