// Attention launchers: one 256-thread block per (token, KV group, split), one instantiation per
// (cache dtype, head_dim in {64, 128}); a combine kernel (one block per token x KV group x 256
// outputs) that folds the chunk states when S > 1.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention.cuh"
#include "native/attention.h"
#include "native/cuda_check.h"

namespace m3::native {
namespace {

constexpr int kThreads = kernels::kAttnWarps * 32;
constexpr int kCombineThreads = 256;

template <class C, int D>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(kernels::AttentionParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  kernels::attention_split_work<C, D>(int64_t(blockIdx.x), int(threadIdx.x), smem, p);
}

__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(kernels::AttentionParams p) {
  extern __shared__ float wts[];
  kernels::attention_combine_work(int64_t(blockIdx.x), int(threadIdx.x), kCombineThreads, wts, p);
}

template <class C, int D>
void launch_split(const kernels::AttentionParams& p, int64_t blocks, int group, cudaStream_t s) {
  const int smem = kernels::AttnSmem<C, D>::bytes(group);
  M3_CHECK(smem <= 48 * 1024, "attention: {} bytes of shared memory for group {} x head_dim {}", smem, group, D);
  attention_split_kernel<C, D><<<unsigned(blocks), kThreads, size_t(smem), s>>>(p);
}

}  // namespace

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

int attention_forward(const AttentionArgs& a, const StepMetadataView& meta, const KvLayerView& cache,
                      cudaStream_t stream) {
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
  if (T == 0) return 1;
  const int max_tiles = attention_max_tiles(a.selected != nullptr, a.topk, cache.block_size, meta.max_context);
  const int P = a.tiles_per_chunk > 0 ? a.tiles_per_chunk : kDefaultTilesPerChunk;
  const int C = attention_chunks(max_tiles, P);
  int S = a.num_splits > 0 ? std::min(a.num_splits, std::max(C, 1)) : attention_splits(T, KV, C, device_sm_count());
  const int64_t blocks = int64_t(T) * KV * S;
  M3_CHECK(blocks < (int64_t(1) << 31), "attention: {} work items exceed the grid", blocks);

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
  if (S > 1) {
    size_t need = attention_workspace_bytes(T, a.num_heads, KV, D, C);
    M3_CHECK(a.workspace && a.workspace_bytes >= need, "attention: workspace {} bytes, {} chunks need {}",
             a.workspace_bytes, C, need);
    p.part_o = static_cast<float*>(a.workspace);
    p.part_ml = p.part_o + size_t(T) * a.num_heads * C * D;
    p.part_n = reinterpret_cast<int32_t*>(p.part_ml + size_t(T) * a.num_heads * C * 2);
  }
  const int group = a.num_heads / KV;
  using kernels::CacheBf16;
  using kernels::CacheFp8;
  if (cache.kv_dtype == DType::F8_E4M3) {
    if (D == 64) launch_split<CacheFp8, 64>(p, blocks, group, stream);
    else launch_split<CacheFp8, 128>(p, blocks, group, stream);
  } else if (cache.kv_dtype == DType::BF16) {
    if (D == 64) launch_split<CacheBf16, 64>(p, blocks, group, stream);
    else launch_split<CacheBf16, 128>(p, blocks, group, stream);
  } else {
    M3_FAIL("attention: K/V cache dtype {} unsupported", dtype_name(cache.kv_dtype));
  }
  M3_LAUNCH_CHECK(stream);
  if (S > 1) {
    const size_t wsmem = size_t(kernels::attention_combine_smem_floats(group, C)) * sizeof(float);
    M3_CHECK(wsmem <= 48 * 1024, "attention: {} chunks x {} heads exceed the combine kernel's shared memory (raise "
             "tiles_per_chunk)", C, group);
    const int64_t cblocks = int64_t(T) * KV * kernels::attention_combine_chunks(group, D, kCombineThreads);
    attention_combine_kernel<<<unsigned(cblocks), kCombineThreads, wsmem, stream>>>(p);
    M3_LAUNCH_CHECK(stream);
  }
  return S;
}

}  // namespace m3::native
