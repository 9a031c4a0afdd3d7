// Native launcher of paged attention (kernels/attention.cuh): block-sparse over the indexer's
// selected blocks (sparse layers) or dense causal (full-attention layers), FP8 or BF16 K/V,
// split-K over key tiles with a combine pass when the split count is above one.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "native/kv_cache.h"
#include "native/launch.h"
#include "native/step_metadata.h"

namespace m3::native {

struct AttentionArgs {
  const float* q = nullptr;  // [T, H*D] fp32, normed and rotated
  int num_heads = 0;         // H (a multiple of the cache's kv_heads, at most 16 per KV head)
  int32_t* selected = nullptr;  // [T, KV, topk] from indexer_select; null = dense causal
  int topk = 0;
  // Optional (sparse): the indexer's block scores [T, KV, max_q_blocks]; the split items then
  // select the top-k blocks themselves (kernels/block_topk.cuh; `selected` gets the same lists,
  // written, not read). Refused when the selection's scratch does not fit
  // (kernels::attention_topk_fits).
  const float* topk_scores = nullptr;
  int max_q_blocks = 0, topk_local = 0;
  float softmax_scale = 0;   // 0 = 1 / sqrt(head_dim)
  int num_splits = 0;        // thread blocks per (token, KV group); 0 = attention_splits(...)
  int tiles_per_chunk = 0;   // 32-key tiles per chunk; 0 = kDefaultTilesPerChunk. Fixes the numerics:
                             // keep it constant across steps for batch-invariant results.
  void* workspace = nullptr; // attention_workspace_bytes(...) bytes (unused when the split count is 1)
  size_t workspace_bytes = 0;
  float* out = nullptr;      // [T, H*D] fp32
};

inline constexpr int kDefaultTilesPerChunk = 2;  // 64 keys: small enough to spread one decode row over many blocks

// Thread blocks per (token, KV group) used when AttentionArgs::num_splits is 0: enough work items
// to fill the device about four times over, at most one per chunk. Any value gives the same
// output bits (kernels/attention.cuh): only speed and workspace depend on it.
int attention_splits(int num_tokens, int kv_heads, int max_chunks, int num_sms);
// Longest key list of any row, in 32-key tiles (sparse: topk blocks; dense: max_context).
int attention_max_tiles(bool sparse, int topk, int block_size, int max_context);
inline int attention_chunks(int max_tiles, int tiles_per_chunk) {
  return (max_tiles + tiles_per_chunk - 1) / tiles_per_chunk;
}
// Workspace of a launch with more than one block per (token, KV group): every chunk's state.
size_t attention_workspace_bytes(int num_tokens, int num_heads, int kv_heads, int head_dim, int max_chunks);

// The params of the split work (and, when num_splits > 1, of the combine: the same params), with
// every check; a refusal names the op and what is wrong.
kernels::AttentionParams make_attention_params(const AttentionArgs& a, const StepMetadataView& meta,
                                               const KvLayerView& cache);
void launch_attention_split(const kernels::AttentionParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch_attention_combine(const kernels::AttentionParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

// make + launch (split, then combine when S > 1). Returns the split count it used.
int attention_forward(const AttentionArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                      cudaStream_t stream);

}  // namespace m3::native
