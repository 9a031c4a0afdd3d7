// Native launcher of paged attention (kernels/attention.cuh): block-sparse over the indexer's
// selected blocks (sparse layers) or dense causal (full-attention layers), FP8 or BF16 K/V,
// split-K over key tiles with a combine pass when the split count is above one.
#pragma once
#include <cstddef>
#include <cstdint>

#include "native/kv_cache.h"
#include "native/step_metadata.h"

namespace m3::native {

struct AttentionArgs {
  const float* q = nullptr;  // [T, H*D] fp32, normed and rotated
  int num_heads = 0;         // H (a multiple of the cache's kv_heads, at most 16 per KV head)
  const int32_t* selected = nullptr;  // [T, KV, topk] from indexer_select; null = dense causal
  int topk = 0;
  float softmax_scale = 0;   // 0 = 1 / sqrt(head_dim)
  int num_splits = 0;        // 0 = chosen from the shape and the device (attention_splits)
  void* workspace = nullptr; // attention_workspace_bytes(...) bytes (unused when the split count is 1)
  size_t workspace_bytes = 0;
  float* out = nullptr;      // [T, H*D] fp32
};

// The split count used when AttentionArgs::num_splits is 0: enough (token, group, split) work
// items to fill the device about four times over, at least two 32-key tiles per split.
int attention_splits(int num_tokens, int kv_heads, int max_tiles_per_row, int num_sms);
// Longest key list of any row, in 32-key tiles (sparse: topk blocks; dense: max_context).
int attention_max_tiles(bool sparse, int topk, int block_size, int max_context);
size_t attention_workspace_bytes(int num_tokens, int num_heads, int head_dim, int num_splits);

// Returns the split count it used.
int attention_forward(const AttentionArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                      cudaStream_t stream);

}  // namespace m3::native
