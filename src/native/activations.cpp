// Activations (native/activations.h).
#include "native/activations.h"

#include <algorithm>

#include "native/attention.h"
#include "native/indexer.h"
#include "native/linear.h"
#include "native/moe.h"

namespace m3::native {

namespace {
constexpr size_t kMaxAttnWorkspace = size_t(512) << 20;  // bytes for the multi-block mode
constexpr int64_t kTpChunkFloats = int64_t(1) << 22;      // 16 MB a rank per all-gather of a rank reduce
int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }
}  // namespace

Activations::Activations(const ForwardModel& m, int max_tokens_, int logits_rows_)
    : max_tokens(max_tokens_), logits_rows(logits_rows_) {
  const ModelSpec& s = m.spec();
  M3_CHECK(max_tokens > 0 && logits_rows > 0, "forward: max_tokens {} and logits_rows {} must be > 0", max_tokens,
           logits_rows);
  const int64_t T = max_tokens, H = s.hidden;
  int64_t width = 0;
  for (int l = 0; l < s.num_layers; ++l) width = std::max(width, qk_norm_rope_args(s, l).proj_stride);
  proj_ld = round4(width);
  const int64_t iqd = int64_t(s.index_heads) * s.index_dim;
  x = DevBuf(size_t(T * H) * 4);
  f = DevBuf(size_t(T * H) * 4);
  a = DevBuf(size_t(T * H) * 4);
  ss = DevBuf(size_t(T * std::max<int64_t>(H / kernels::kNormChunk, 1)) * 4);
  inv = DevBuf(size_t(T) * 4);
  proj = DevBuf(size_t(T * proj_ld) * 4);
  q = DevBuf(size_t(T * s.q_dim()) * 4);
  o = DevBuf(size_t(T * s.q_dim()) * 4);
  iq = DevBuf(size_t(std::max<int64_t>(T * iqd, 4)) * 4);
  ids = DevBuf(size_t(T) * 4);
  rows = DevBuf(size_t(T) * 4);
  gather = DevBuf(size_t(std::min<int64_t>(T, logits_rows) * H) * 4);
  logits = DevBuf(size_t(logits_rows) * size_t(s.vocab_size) * 4);
  ld_h = round4(std::max(s.dense_inter, 1));
  bool dense = false;
  size_t moe = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    if (s.moe(l)) moe = std::max(moe, moe_workspace_bytes(m.layer(l).moe, int(T)));
    else dense = true;
  }
  if (dense) h = DevBuf(size_t(T * ld_h) * 4);
  if (moe) moe_ws = DevBuf(moe);
  if (s.num_sparse_layers() > 0) {
    idx_ws = DevBuf(indexer_workspace_bytes(int(T), s.index_heads, m.max_model_len(), s.index_block));
    sel = DevBuf(size_t(T) * size_t(s.num_kv_heads) * size_t(s.index_topk) * 4);
  }
  // Workspace of the multi-block mode: the most any pass of <= T rows can ask for, up to a cap;
  // a pass that would need more runs one block per (token, KV group) instead (same bits).
  size_t aws = 0;
  for (int t = 1; t <= T; ++t)
    for (bool sparse : {false, true}) {
      if (sparse && s.num_sparse_layers() == 0) continue;
      const int tiles = attention_max_tiles(sparse, s.index_topk, s.index_block, m.max_model_len());
      const int C = attention_chunks(tiles, m.tiles_per_chunk(sparse));
      if (attention_splits(t, s.num_kv_heads, C, m.sms()) <= 1) continue;
      const size_t need = attention_workspace_bytes(t, s.num_heads, s.num_kv_heads, s.head_dim, C);
      if (need <= kMaxAttnWorkspace) aws = std::max(aws, need);
    }
  attn_ws = DevBuf(std::max<size_t>(aws, 16));
  route_arrivals = DevBuf(16);
  rope_arrivals = DevBuf(size_t(s.num_heads + 2 * s.num_kv_heads + s.index_heads + 1) * 4);
  combine_arrivals = DevBuf(size_t((H + 31) / 32) * 4);
  reset_counters(nullptr);
  M3_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  split_rows = int(std::min<int64_t>(T, kMmaDecodeRows));
  a_split = DevBuf(size_t(split_rows * H) * 4);
  o_split = DevBuf(size_t(split_rows * s.q_dim()) * 4);
  if (DeviceComm* c = m.comm()) {
    const int64_t vr = m.weights().lm_head().rows;
    tp_chunk = std::min<int64_t>(T * H, kTpChunkFloats);
    tp_gather = DevBuf(size_t(c->size()) * size_t(std::max<int64_t>(tp_chunk, int64_t(logits_rows) * vr)) * 4);
    logits_local = DevBuf(size_t(logits_rows) * size_t(vr) * 4);
  }
}

void Activations::reset_counters(cudaStream_t stream) const {
  M3_CUDA_CHECK(cudaMemsetAsync(route_arrivals.get(), 0, route_arrivals.bytes(), stream));
  M3_CUDA_CHECK(cudaMemsetAsync(rope_arrivals.get(), 0, rope_arrivals.bytes(), stream));
  M3_CUDA_CHECK(cudaMemsetAsync(combine_arrivals.get(), 0, combine_arrivals.bytes(), stream));
}

}  // namespace m3::native
