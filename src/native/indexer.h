// Native launcher of the MSA indexer (kernels/indexer.cuh): per token and index group, the top-k
// key blocks by max-pooled index score, local blocks forced. Two launches: block scores (one
// thread block per token (or tile of tokens) x visible block), then selection (one thread block
// per token x group).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/indexer_params.h"
#include "native/kv_cache.h"
#include "native/launch.h"
#include "native/step_metadata.h"

namespace m3::native {

struct IndexerArgs {
  const float* iq = nullptr;  // [T, IH*ID] fp32, normed and rotated (qk_norm_rope_cache output)
  int index_heads = 0, index_dim = 0;
  int topk = 0;   // blocks kept per group
  int local = 0;  // forced blocks ending at the query's own block
  void* workspace = nullptr;  // indexer_workspace_bytes() bytes
  size_t workspace_bytes = 0;
  int32_t* selected = nullptr;  // [T, IH, topk] logical block ids, ascending, -1 padded
};

// Workspace for T rows whose causal lengths are at most max_context.
size_t indexer_workspace_bytes(int num_tokens, int index_heads, int max_context, int block_size);

// The params of both launches (block scores, then top-k), with every check.
kernels::IndexerParams make_indexer_params(const IndexerArgs& a, const StepMetadataView& meta,
                                           const KvLayerView& cache);
void launch_indexer_scores(const kernels::IndexerParams& p, cudaStream_t stream, const LaunchOptions& opt = {});
void launch_indexer_topk(const kernels::IndexerParams& p, cudaStream_t stream, const LaunchOptions& opt = {});

// Tokens per score item: by default kIndexerTokTile from kIndexerTileMinTokens tokens on (prefill:
// a block's keys copied once for many tokens), else 1; a test can force 1 or the tile (-1: the
// default). A speed choice only: the same bits either way.
constexpr int kIndexerTileMinTokens = 32;
void indexer_set_token_tile(int tokens);

// make + both launches: selects blocks for meta.num_tokens rows from the layer's index-K cache.
void indexer_select(const IndexerArgs& a, const StepMetadataView& meta, const KvLayerView& cache, cudaStream_t stream);

}  // namespace m3::native
