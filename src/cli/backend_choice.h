// Backend selection shared by the commands that run the model (generate, conformance):
//   --device cpu|cuda|auto   (auto: the CUDA native backend when this build has CUDA and a GPU is
//                             visible, else the CPU reference)
//   --weights checkpoint|prepared   (CPU reference only: the checkpoint's weights in fp32, or the
//                             prepared GPU store — FP8 attention, MXFP4 experts, BF16 rest —
//                             dequantized back to fp32, i.e. exactly the numbers the GPU uses)
//   --cache-dtype fp32|bf16|fp8  (the caches: CUDA stores bf16 or fp8 (default); the CPU
//                             reference stores fp32 and can round it through the same codec)
//   --router-dtype float32|bfloat16  (the prepared store's router weight; logits, sigmoid and the
//                             correction bias stay fp32 either way)
//   --mono                    (CUDA: the fused decode path for the batches it serves)
#pragma once
#include <memory>
#include <string>

#include "model/spec.h"
#include "model/weights.h"
#include "runtime/backend.h"

namespace m3::cli {

struct BackendChoice {
  std::string device = "auto";
  std::string weights = "checkpoint";
  int threads = 0;        // CPU reference threads (0 = all cores)
  int cache_blocks = 0;   // paged cache blocks
  int max_seq_len = 0;    // longest sequence the backend must hold (CUDA launch sizing; 0 = cache size)
  // K/V and index-K cache element type: "" = the backend's default (CPU reference: exact fp32;
  // CUDA: fp8), "fp8" or "bf16" (CUDA: the caches' type; CPU reference: what it writes is rounded
  // through the GPU's codec, ref/cache_codec.h), "fp32" (CPU reference only).
  std::string cache_dtype = "";
  std::string router_dtype = "float32";  // prepared router weight: float32 or bfloat16
  // --mono: register the fused persistent decode path (src/mono) on the CUDA backend; every step
  // it accepts runs its sparse layers (decode batches of at most 4 rows), any other runs natively.
  // A static refusal is printed with its reasons and the backend runs native only.
  bool mono = false;
  // --tp N: tensor parallelism over N ranks (model/tp_shard.h). The CPU reference runs N ranks as
  // threads of this process (RefOptions::tp), or one per process under mpirun; the GPU path runs N
  // rank backends as threads of this process, rank r on GPU r mod the visible GPUs
  // (native/cuda_tp_backend.h), with the collectives --tp-comm names.
  int tp = 1;
  // --tp-comm auto|nccl|host: the GPU ranks' collectives (NCCL: one GPU per rank; host: through the
  // host, any number of ranks per GPU, no CUDA graphs; auto: NCCL when every rank has its own GPU).
  std::string tp_comm = "auto";
  // --tp-launch threads|processes: the ranks as threads of this process, or (processes, --tp > 1,
  // not already under mpirun) this command started again as `mpirun -np N <the same command>`
  // before anything is loaded: one rank per process, rank 0 reporting.
  std::string tp_launch = "threads";
};

// Throws naming the flag when a value is not one of the choices.
void validate_backend_choice(const BackendChoice& c, const char* command);

// True when --device auto would pick CUDA.
bool cuda_usable();

// The prepared store of `model_dir` dequantized to fp32 (host only; no GPU needed).
ModelWeights load_prepared_dequantized(const std::string& model_dir, const ModelSpec& spec, bool router_bf16 = false);

// Builds the backend the choice names for the checkpoint in model_dir.
std::unique_ptr<Backend> make_chosen_backend(const BackendChoice& c, const std::string& model_dir,
                                             const ModelSpec& spec, const char* command);

}  // namespace m3::cli
