// Attention launchers: one 256-thread item per (token, KV group, split), one instantiation per
// (cache dtype, head_dim in {64, 128}); a combine (one item per token x KV group x 256 outputs)
// that folds the chunk states when S > 1.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention.cuh"
#include "native/attention.h"
#include "native/cuda_check.h"
#include "native/launch.cuh"

namespace m3::native {

int attention_max_tiles(bool sparse, int topk, int block_size, int max_context) {
  int64_t keys = sparse ? int64_t(topk) * block_size : int64_t(max_context);
  return int((keys + kernels::kAttnTile - 1) / kernels::kAttnTile);
}

int attention_splits(int num_tokens, int kv_heads, int max_chunks, int num_sms) {
  int64_t rows = int64_t(num_tokens) * kv_heads;
  if (rows <= 0 || max_chunks <= 1) return 1;
  int64_t want = (int64_t(4) * num_sms + rows - 1) / rows;
  int64_t s = want < max_chunks ? want : max_chunks;
  return int(s < 1 ? 1 : s);
}

size_t attention_workspace_bytes(int num_tokens, int num_heads, int kv_heads, int head_dim, int max_chunks) {
  if (max_chunks <= 1) return 0;
  return size_t(num_tokens) * size_t(num_heads) * size_t(max_chunks) * (size_t(head_dim) + 2) * sizeof(float) +
         size_t(num_tokens) * size_t(kv_heads) * sizeof(int32_t);
}

kernels::AttentionParams make_attention_params(const AttentionArgs& a, const StepMetadataView& meta,
                                               const KvLayerView& cache) {
  const int T = meta.num_tokens;
  const int KV = cache.kv_heads, D = cache.head_dim;
  M3_CHECK(KV > 0 && a.num_heads > 0 && a.num_heads % KV == 0, "attention: {} query heads for {} KV heads",
           a.num_heads, KV);
  M3_CHECK(a.num_heads / KV <= kernels::kAttnMaxGroup, "attention: {} query heads per KV head exceed {}",
           a.num_heads / KV, kernels::kAttnMaxGroup);
  M3_CHECK(D == 64 || D == 128, "attention: head_dim {} unsupported (64 or 128)", D);
  M3_CHECK(cache.k && cache.v, "attention: cache K/V pointers are null");
  M3_CHECK(a.q && a.out, "attention: q and out must be set");
  M3_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0, "attention: q must be 16-byte aligned");
  M3_CHECK(!a.selected || a.topk > 0, "attention: selected blocks given with topk {}", a.topk);
  M3_CHECK(cache.kv_dtype == DType::F8_E4M3 || cache.kv_dtype == DType::BF16,
           "attention: K/V cache dtype {} unsupported", dtype_name(cache.kv_dtype));
  const int max_tiles = attention_max_tiles(a.selected != nullptr, a.topk, cache.block_size, meta.max_context);
  const int P = a.tiles_per_chunk > 0 ? a.tiles_per_chunk : kDefaultTilesPerChunk;
  const int C = attention_chunks(max_tiles, P);
  const int S = a.num_splits > 0 ? std::min(a.num_splits, std::max(C, 1)) : attention_splits(T, KV, C, device_sm_count());
  kernels::AttentionParams p;
  p.q = a.q;
  p.k_cache = cache.k;
  p.v_cache = cache.v;
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  p.positions = meta.positions;
  p.token_seq = meta.token_seq;
  p.block_tables = meta.block_tables;
  p.table_width = meta.table_width;
  p.selected = a.selected;
  p.topk = a.topk;
  if (a.topk_scores) {
    M3_CHECK(a.selected && a.max_q_blocks > 0 && a.max_q_blocks * cache.block_size > meta.max_context - 1 &&
                 a.topk_local >= 0,
             "attention: top-k from block scores needs selected, {} blocks >= the context {} / block {} and local {} >= 0",
             a.max_q_blocks, meta.max_context, cache.block_size, a.topk_local);
    M3_CHECK(kernels::attention_topk_fits(D, cache.kv_dtype == DType::F8_E4M3 ? 1 : 2, a.max_q_blocks, a.topk),
             "attention: the top-k of {} of {} blocks does not fit the split item's shared memory (head_dim {})",
             a.topk, a.max_q_blocks, D);
    p.topk_scores = a.topk_scores;
    p.max_q_blocks = a.max_q_blocks;
    p.topk_local = a.topk_local;
  }
  p.num_tokens = T;
  p.num_heads = a.num_heads;
  p.kv_heads = KV;
  p.head_dim = D;
  p.block_size = cache.block_size;
  p.softmax_scale = a.softmax_scale > 0 ? a.softmax_scale : float(1.0 / std::sqrt(double(D)));
  p.num_splits = S;
  p.tiles_per_chunk = P;
  p.max_chunks = C;
  p.out = a.out;
  p.kv_fmt = cache.kv_dtype == DType::F8_E4M3 ? kernels::CacheFmt::FP8 : kernels::CacheFmt::BF16;
  const int group = a.num_heads / KV;
  const int smem = kernels::attention_split_shape(p).smem_bytes;
  M3_CHECK(smem <= kernels::kAttnSplitSmemCap, "attention: {} bytes of shared memory for group {} x head_dim {}", smem, group, D);
  if (S > 1) {
    size_t need = attention_workspace_bytes(T, a.num_heads, KV, D, C);
    M3_CHECK(a.workspace && a.workspace_bytes >= need, "attention: workspace {} bytes, {} chunks need {}",
             a.workspace_bytes, C, need);
    p.part_o = static_cast<float*>(a.workspace);
    p.part_ml = p.part_o + size_t(T) * a.num_heads * C * D;
    p.part_n = reinterpret_cast<int32_t*>(p.part_ml + size_t(T) * a.num_heads * C * 2);
    const int wsmem = kernels::attention_combine_shape(p).smem_bytes;
    M3_CHECK(wsmem <= 48 * 1024,
             "attention: {} chunks x {} heads exceed the combine's shared memory (raise tiles_per_chunk)", C, group);
  }
  return p;
}

void launch_attention_split(const kernels::AttentionParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  using namespace kernels;
  const WorkShape sh = attention_split_shape(p);
  const bool fp8 = p.kv_fmt == CacheFmt::FP8;
  if (p.head_dim == 64) {
    if (fp8) launch_op<AttentionSplitOp<CacheFp8, 64>>(p, sh, stream, "attention", opt);
    else launch_op<AttentionSplitOp<CacheBf16, 64>>(p, sh, stream, "attention", opt);
  } else {
    if (fp8) launch_op<AttentionSplitOp<CacheFp8, 128>>(p, sh, stream, "attention", opt);
    else launch_op<AttentionSplitOp<CacheBf16, 128>>(p, sh, stream, "attention", opt);
  }
}

void launch_attention_combine(const kernels::AttentionParams& p, cudaStream_t stream, const LaunchOptions& opt) {
  M3_CHECK(p.num_splits > 1, "attention combine: nothing to combine (1 split)");
  launch_op<kernels::AttentionCombineOp>(p, kernels::attention_combine_shape(p), stream, "attention_combine", opt);
}

int attention_forward(const AttentionArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                      cudaStream_t stream) {
  if (meta.num_tokens == 0) return 1;
  const kernels::AttentionParams p = make_attention_params(a, meta, cache);
  launch_attention_split(p, stream);
  if (p.num_splits > 1) launch_attention_combine(p, stream);
  return p.num_splits;
}

}  // namespace m3::native
