// Params and work shapes of the MSA indexer (kernels/indexer.cuh): block scores, then top-k.
#pragma once
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/work.h"

namespace m3::kernels {

constexpr int kIndexerMaxHeads = 8;

struct IndexerParams {
  const float* iq = nullptr;        // [T, IH*ID]
  const void* ik_cache = nullptr;   // [slots, ID]
  float ik_scale = 1;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* block_tables = nullptr;  // [num_seqs, table_width]
  int table_width = 0;
  int num_tokens = 0, index_heads = 0, index_dim = 0, block_size = 0;
  int max_q_blocks = 0;  // >= p/bs + 1 for every token (bounds the grid and the workspace)
  int topk = 0, local = 0;
  float* block_scores = nullptr;  // [T, IH, max_q_blocks] workspace
  int32_t* selected = nullptr;    // [T, IH, topk]
  CacheFmt ik_fmt = CacheFmt::FP8;  // index-K cache elements (instantiation)
  // Scores: tokens per item (1: item = (token, block); > 1: item = (kIndexerTokTile consecutive
  // tokens, block), the block's keys copied once for the tokens of one request). The same bits.
  int tok_tile = 1;
};
constexpr int kIndexerTokTile = 16;

// Shared memory of the score work: iq [IH][ID] fp32, warp maxima [32][IH] fp32, then the block's
// keys, one row of ID * bytes + 16 (padding: lane-per-row 16-byte reads hit distinct banks).
M3_HOST_DEVICE inline int indexer_scores_smem_bytes(int index_heads, int index_dim, int block_size,
                                                        int elem_bytes) {
  return (index_heads * index_dim + 32 * index_heads) * 4 + block_size * (index_dim * elem_bytes + 16);
}

// Shared memory of the top-k work, for n8 = max_q_blocks rounded up to 8: scores [n8] (padded with
// -inf), keep flags [n8], candidate ids [n8 + 4] and scores [n8 + 4], one counter.
M3_HOST_DEVICE inline int indexer_topk_smem_bytes(int max_q_blocks) {
  const int n8 = (max_q_blocks + 7) / 8 * 8;
  return n8 * 4 * 2 + (n8 + 4) * 4 * 2 + 16;
}

// The token-tiled score work: iq of the tile's tokens [TT][IH][ID] fp32, warp maxima [TT][32][IH],
// then the block's keys as above.
M3_HOST_DEVICE inline int indexer_scores_tiled_smem_bytes(int index_heads, int index_dim, int block_size,
                                                          int elem_bytes) {
  return (kIndexerTokTile * index_heads * index_dim + kIndexerTokTile * 32 * index_heads) * 4 +
         block_size * (index_dim * elem_bytes + 16);
}

constexpr int kIndexerScoreThreads = 128;  // one key per thread at block size 128
constexpr int kIndexerTopkThreads = 256;

// Scores: item w = t * max_q_blocks + b (tok_tile 1) or tile * max_q_blocks + b. Top-k: item
// w = t * IH + g.
M3_HOST_DEVICE inline WorkShape indexer_scores_shape(const IndexerParams& p) {
  const int eb = p.ik_fmt == CacheFmt::FP8 ? 1 : 2;
  if (p.tok_tile > 1)
    return {ceil_div(p.num_tokens, kIndexerTokTile) * p.max_q_blocks, kIndexerScoreThreads,
            indexer_scores_tiled_smem_bytes(p.index_heads, p.index_dim, p.block_size, eb)};
  return {int64_t(p.num_tokens) * p.max_q_blocks, kIndexerScoreThreads,
          indexer_scores_smem_bytes(p.index_heads, p.index_dim, p.block_size, eb)};
}
M3_HOST_DEVICE inline WorkShape indexer_topk_shape(const IndexerParams& p) {
  return {int64_t(p.num_tokens) * p.index_heads, kIndexerTopkThreads, indexer_topk_smem_bytes(p.max_q_blocks)};
}

}  // namespace m3::kernels
