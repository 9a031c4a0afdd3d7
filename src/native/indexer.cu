// Indexer launchers: block scores with 128-thread blocks (one key per thread at block size 128),
// then top-k with one 256-thread block per (token, group) over a shared-memory copy of its block
// scores.
#include <cstdint>

#include "kernels/indexer.cuh"
#include "native/cuda_check.h"
#include "native/indexer.h"

namespace m3::native {
namespace {

constexpr int kScoreThreads = 128;

template <class C>
__global__ void __launch_bounds__(kScoreThreads) indexer_scores_kernel(kernels::IndexerParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  kernels::indexer_block_scores_work<C>(int64_t(blockIdx.x), int(threadIdx.x), kScoreThreads, smem, p);
}

constexpr int kTopkThreads = 256;

__global__ void __launch_bounds__(kTopkThreads) indexer_topk_kernel(kernels::IndexerParams p) {
  extern __shared__ __align__(16) uint8_t scratch[];
  kernels::indexer_topk_work(int64_t(blockIdx.x), int(threadIdx.x), kTopkThreads, scratch, p);
}

int max_q_blocks(int max_context, int block_size) { return (max_context + block_size - 1) / block_size; }

}  // namespace

size_t indexer_workspace_bytes(int num_tokens, int index_heads, int max_context, int block_size) {
  return size_t(num_tokens) * size_t(index_heads) * size_t(max_q_blocks(max_context, block_size)) * sizeof(float);
}

void indexer_select(const IndexerArgs& a, const StepMetadataView& meta, const KvLayerView& cache, cudaStream_t stream) {
  const int T = meta.num_tokens;
  if (T == 0) return;
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
  const int mqb = max_q_blocks(meta.max_context, cache.block_size);
  size_t need = indexer_workspace_bytes(T, a.index_heads, meta.max_context, cache.block_size);
  M3_CHECK(a.workspace && a.workspace_bytes >= need, "indexer: workspace {} bytes, need {}", a.workspace_bytes, need);
  M3_CHECK(int64_t(T) * mqb < (int64_t(1) << 31), "indexer: {} rows x {} blocks exceed the grid", T, mqb);

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

  const size_t smem1 = size_t(kernels::indexer_scores_smem_bytes(a.index_heads, a.index_dim, cache.block_size,
                                                                  int(dtype_size(cache.ik_dtype))));
  M3_CHECK(smem1 <= 48 * 1024,
           "indexer: {} index heads x {} dims, block {} need {} bytes of shared memory in the score kernel (max 48K)",
           a.index_heads, a.index_dim, cache.block_size, smem1);
  if (cache.ik_dtype == DType::F8_E4M3)
    indexer_scores_kernel<kernels::CacheFp8><<<unsigned(int64_t(T) * mqb), kScoreThreads, smem1, stream>>>(p);
  else if (cache.ik_dtype == DType::BF16)
    indexer_scores_kernel<kernels::CacheBf16><<<unsigned(int64_t(T) * mqb), kScoreThreads, smem1, stream>>>(p);
  else
    M3_FAIL("indexer: index-K cache dtype {} unsupported", dtype_name(cache.ik_dtype));
  M3_LAUNCH_CHECK(stream);

  const size_t smem2 = size_t(kernels::indexer_topk_smem_bytes(mqb));
  M3_CHECK(smem2 <= 200 * 1024, "indexer: {} blocks of context exceed the top-k kernel's shared memory", mqb);
  allow_dynamic_smem(reinterpret_cast<const void*>(indexer_topk_kernel), smem2);
  indexer_topk_kernel<<<unsigned(int64_t(T) * a.index_heads), kTopkThreads, smem2, stream>>>(p);
  M3_LAUNCH_CHECK(stream);
}

}  // namespace m3::native
