// Indexer launchers: block scores with 128-thread items (one key per thread at block size 128),
// then top-k with one 256-thread item per (token, group) over a shared-memory copy of its block
// scores.
#include <atomic>
#include <cstdint>

#include "kernels/indexer.cuh"
#include "native/cuda_check.h"
#include "native/indexer.h"
#include "native/launch.cuh"

namespace m3::native {
namespace {
int max_q_blocks(int max_context, int block_size) { return (max_context + block_size - 1) / block_size; }
std::atomic<int> g_token_tile{-1};
}  // namespace

void indexer_set_token_tile(int tokens) {
  M3_CHECK(tokens == -1 || tokens == 1 || tokens == kernels::kIndexerTokTile,
           "indexer_set_token_tile: {} (-1 for the default, 1 or {})", tokens, kernels::kIndexerTokTile);
  g_token_tile.store(tokens);
}

size_t indexer_workspace_bytes(int num_tokens, int index_heads, int max_context, int block_size) {
  return size_t(num_tokens) * size_t(index_heads) * size_t(max_q_blocks(max_context, block_size)) * sizeof(float);
}

kernels::IndexerParams make_indexer_params(const IndexerArgs& a, const StepMetadataView& meta,
                                           const KvLayerView& cache) {
  const int T = meta.num_tokens;
  M3_CHECK(a.index_heads > 0 && a.index_heads <= kernels::kIndexerMaxHeads, "indexer: index_heads {} outside [1, {}]",
           a.index_heads, kernels::kIndexerMaxHeads);
  M3_CHECK(cache.ik && cache.index_dim == a.index_dim, "indexer: index-K cache dim {} (pointer {}) for index_dim {}",
           cache.index_dim, cache.ik ? "set" : "null", a.index_dim);
  M3_CHECK(a.index_dim > 0 && a.index_dim % 16 == 0, "indexer: index_dim {} must be a positive multiple of 16",
           a.index_dim);
  M3_CHECK(a.topk > 0 && a.local >= 0, "indexer: topk {} must be > 0 and local {} >= 0", a.topk, a.local);
  M3_CHECK(meta.max_context > 0, "indexer: step has no live row (max_context {})", meta.max_context);
  M3_CHECK(a.iq && a.selected, "indexer: iq and selected must be set");
  M3_CHECK(reinterpret_cast<uintptr_t>(a.iq) % 16 == 0, "indexer: iq must be 16-byte aligned");
  M3_CHECK(cache.ik_dtype == DType::F8_E4M3 || cache.ik_dtype == DType::BF16,
           "indexer: index-K cache dtype {} unsupported", dtype_name(cache.ik_dtype));
  const int mqb = max_q_blocks(meta.max_context, cache.block_size);
  size_t need = indexer_workspace_bytes(T, a.index_heads, meta.max_context, cache.block_size);
  M3_CHECK(a.workspace && a.workspace_bytes >= need, "indexer: workspace {} bytes, need {}", a.workspace_bytes, need);

  kernels::IndexerParams p;
  p.iq = a.iq;
  p.ik_cache = cache.ik;
  p.ik_scale = cache.ik_scale;
  p.positions = meta.positions;
  p.token_seq = meta.token_seq;
  p.block_tables = meta.block_tables;
  p.table_width = meta.table_width;
  p.num_tokens = T;
  p.index_heads = a.index_heads;
  p.index_dim = a.index_dim;
  p.block_size = cache.block_size;
  p.max_q_blocks = mqb;
  p.topk = a.topk;
  p.local = a.local;
  p.block_scores = static_cast<float*>(a.workspace);
  p.selected = a.selected;
  p.ik_fmt = cache.ik_dtype == DType::F8_E4M3 ? kernels::CacheFmt::FP8 : kernels::CacheFmt::BF16;
  const int forced = g_token_tile.load();
  p.tok_tile = forced > 0 ? forced : T >= kIndexerTileMinTokens ? kernels::kIndexerTokTile : 1;
  // (the tiled item holds kIndexerTokTile tokens' iq: fall back to one token where that is too big)
  if (p.tok_tile > 1 && kernels::indexer_scores_shape(p).smem_bytes > 160 * 1024) p.tok_tile = 1;
  const int smem1 = kernels::indexer_scores_shape(p).smem_bytes;
  M3_CHECK(p.tok_tile > 1 || smem1 <= 48 * 1024,
           "indexer: {} index heads x {} dims, block {} need {} bytes of shared memory in the score kernel (max 48K)",
           a.index_heads, a.index_dim, cache.block_size, smem1);
  M3_CHECK(kernels::indexer_topk_shape(p).smem_bytes <= 200 * 1024,
           "indexer: {} blocks of context exceed the top-k kernel's shared memory", mqb);
  return p;
}

void launch_indexer_scores(const kernels::IndexerParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  const kernels::WorkShape sh = kernels::indexer_scores_shape(p);
  const bool fp8 = p.ik_fmt == kernels::CacheFmt::FP8;
  if (p.tok_tile > 1) {
    M3_CHECK(p.tok_tile == kernels::kIndexerTokTile, "indexer: {} tokens per score item (1 or {})", p.tok_tile,
             kernels::kIndexerTokTile);
    if (fp8) launch_op<kernels::IndexerScoresTiledOp<kernels::CacheFp8>>(p, sh, stream, "indexer_scores", opt);
    else launch_op<kernels::IndexerScoresTiledOp<kernels::CacheBf16>>(p, sh, stream, "indexer_scores", opt);
  } else if (fp8) {
    launch_op<kernels::IndexerScoresOp<kernels::CacheFp8>>(p, sh, stream, "indexer_scores", opt);
  } else {
    launch_op<kernels::IndexerScoresOp<kernels::CacheBf16>>(p, sh, stream, "indexer_scores", opt);
  }
}

void launch_indexer_topk(const kernels::IndexerParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  launch_op<kernels::IndexerTopkOp>(p, kernels::indexer_topk_shape(p), stream, "indexer_topk", opt);
}

void indexer_select(const IndexerArgs& a, const StepMetadataView& meta, const KvLayerView& cache, cudaStream_t stream) {
  if (meta.num_tokens == 0) return;
  const kernels::IndexerParams p = make_indexer_params(a, meta, cache);
  launch_indexer_scores(p, stream);
  launch_indexer_topk(p, stream);
}

}  // namespace m3::native
