// Per-step metadata of the native path: the per-request block tables expanded into per-token rows
// that the kernels index by token. For a request with q new tokens and sequence length s (tokens
// already cached + q), new token j (0 <= j < q) sits at position s - q + j, is written at
//   slot = block_table[pos / block_size] * block_size + pos % block_size,
// and sees the causal length s - q + j + 1 = pos + 1. Padding rows (to a fixed token count)
// have position -1, slot -1 and sequence -1: nothing is written for them and their outputs are
// zeros.
//
// build_step_metadata() is plain host C++ (header-only so CPU tests run it without CUDA);
// DeviceStepMetadata (step_metadata.cpp, CUDA builds) copies the arrays into fixed-address device
// buffers and hands out a StepMetadataView for the kernels.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.h"
#include "runtime/backend.h"

typedef struct CUstream_st* cudaStream_t;

namespace m3::native {

// One request's share of a step, as the scheduler describes it.
struct SeqRows {
  int32_t start_pos = 0;                 // tokens already in the cache
  int32_t num_new = 0;                   // new tokens this step (>= 1)
  std::span<const int32_t> block_table;  // physical blocks covering positions [0, start_pos + num_new)
};

struct StepMetadata {
  int block_size = 0;
  int num_tokens = 0;   // rows, padding included
  int num_live = 0;     // rows that belong to a request (the first num_live rows)
  int num_seqs = 0;
  int table_width = 0;  // columns of block_tables (the longest table in the step)
  int max_context = 0;  // the largest causal length of any row
  std::vector<int32_t> positions;     // [num_tokens], -1 = padding
  std::vector<int32_t> slots;         // [num_tokens], -1 = padding
  std::vector<int32_t> token_seq;     // [num_tokens] request of the row, -1 = padding
  std::vector<int32_t> causal_len;    // [num_tokens] pos + 1, 0 = padding
  std::vector<int32_t> block_tables;  // [num_seqs, table_width], -1 past a request's table
  std::vector<int32_t> seq_lens;      // [num_seqs] s
  std::vector<int32_t> query_start;   // [num_seqs + 1] first row of each request
};

// Builds the rows for `seqs` in order, then pads to `pad_to` rows (0 = no padding). Every block
// id must lie in [0, num_blocks); each table must cover its request's positions; no two rows may
// write the same slot. Errors name the request and the value.
inline StepMetadata build_step_metadata(std::span<const SeqRows> seqs, int block_size, int num_blocks,
                                        int pad_to = 0) {
  M3_CHECK(block_size > 0, "step metadata: block_size must be > 0, got {}", block_size);
  M3_CHECK(num_blocks > 0, "step metadata: num_blocks must be > 0, got {}", num_blocks);
  StepMetadata m;
  m.block_size = block_size;
  m.num_seqs = int(seqs.size());
  int live = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqRows& s = seqs[i];
    M3_CHECK(s.start_pos >= 0, "step metadata: request {} start_pos {} < 0", i, s.start_pos);
    M3_CHECK(s.num_new >= 1, "step metadata: request {} has {} new tokens (need >= 1)", i, s.num_new);
    M3_CHECK(int64_t(s.start_pos) + s.num_new <= INT32_MAX, "step metadata: request {} length overflows", i);
    int64_t need = (int64_t(s.start_pos) + s.num_new + block_size - 1) / block_size;
    M3_CHECK(int64_t(s.block_table.size()) >= need,
             "step metadata: request {} block table has {} blocks, positions up to {} need {}", i,
             s.block_table.size(), s.start_pos + s.num_new - 1, need);
    for (size_t b = 0; b < size_t(need); ++b)
      M3_CHECK(s.block_table[b] >= 0 && s.block_table[b] < num_blocks,
               "step metadata: request {} block_table[{}] = {} outside [0, {})", i, b, s.block_table[b], num_blocks);
    m.table_width = std::max(m.table_width, int(s.block_table.size()));
    live += s.num_new;
  }
  M3_CHECK(pad_to == 0 || pad_to >= live, "step metadata: pad_to {} is below the {} live tokens", pad_to, live);
  m.num_live = live;
  m.num_tokens = std::max(live, pad_to);
  m.positions.assign(size_t(m.num_tokens), -1);
  m.slots.assign(size_t(m.num_tokens), -1);
  m.token_seq.assign(size_t(m.num_tokens), -1);
  m.causal_len.assign(size_t(m.num_tokens), 0);
  m.block_tables.assign(size_t(m.num_seqs) * size_t(m.table_width), -1);
  m.seq_lens.resize(size_t(m.num_seqs));
  m.query_start.resize(size_t(m.num_seqs) + 1);
  int row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqRows& s = seqs[i];
    std::copy(s.block_table.begin(), s.block_table.end(), m.block_tables.begin() + ptrdiff_t(i) * m.table_width);
    int32_t len = s.start_pos + s.num_new;
    m.seq_lens[i] = len;
    m.query_start[i] = row;
    for (int j = 0; j < s.num_new; ++j, ++row) {
      int32_t pos = len - s.num_new + j;
      m.positions[size_t(row)] = pos;
      m.slots[size_t(row)] = s.block_table[size_t(pos / block_size)] * block_size + pos % block_size;
      m.token_seq[size_t(row)] = int32_t(i);
      m.causal_len[size_t(row)] = pos + 1;
      m.max_context = std::max(m.max_context, pos + 1);
    }
  }
  m.query_start[size_t(m.num_seqs)] = row;
  // Two rows writing one slot would race in the cache-insert kernel (and mean two requests share a
  // block they both append to): reject.
  std::vector<int32_t> sorted(m.slots.begin(), m.slots.begin() + live);
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  M3_CHECK(dup == sorted.end(), "step metadata: slot {} is written by two rows of the step", dup == sorted.end() ? 0 : *dup);
  return m;
}

// The tables re-laid at `width` columns (decode buckets' fixed width: launches that do not depend on
// the step). Columns past a request's last needed block may be dropped; a needed one never is.
inline void widen_block_tables(StepMetadata& m, int width) {
  M3_CHECK(width >= 1, "step metadata: table width {}", width);
  std::vector<int32_t> t(size_t(m.num_seqs) * size_t(width), -1);
  const int keep = std::min(m.table_width, width);
  for (int i = 0; i < m.num_seqs; ++i) {
    const int need = (m.seq_lens[size_t(i)] + m.block_size - 1) / m.block_size;
    M3_CHECK(need <= width, "step metadata: request {} needs {} blocks ({} tokens), the tables have {} columns", i,
             need, m.seq_lens[size_t(i)], width);
    std::copy_n(m.block_tables.begin() + ptrdiff_t(i) * m.table_width, keep, t.begin() + ptrdiff_t(i) * width);
  }
  m.block_tables = std::move(t);
  m.table_width = width;
}

// The scheduler's step shape (runtime/backend.h) as rows.
inline StepMetadata build_step_metadata(const StepBatch& batch, int block_size, int num_blocks, int pad_to = 0) {
  std::vector<SeqRows> rows(batch.seqs.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].start_pos = batch.seqs[i].start_pos;
    rows[i].num_new = int32_t(batch.seqs[i].tokens.size());
    rows[i].block_table = batch.seqs[i].block_table;
  }
  return build_step_metadata(rows, block_size, num_blocks, pad_to);
}

// What the kernels read (device pointers).
struct StepMetadataView {
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slots = nullptr;         // [num_tokens]
  const int32_t* token_seq = nullptr;     // [num_tokens]
  const int32_t* block_tables = nullptr;  // [num_seqs, table_width]
  int num_tokens = 0;
  int table_width = 0;
  int max_context = 0;  // host-side bound used to size launches (never read on the device)
};

// Fixed-address device buffers for the metadata of one step (graph replays read new values).
class DeviceStepMetadata {
 public:
  DeviceStepMetadata(int max_tokens, int max_seqs, int max_table_width);
  ~DeviceStepMetadata();
  DeviceStepMetadata(const DeviceStepMetadata&) = delete;
  DeviceStepMetadata& operator=(const DeviceStepMetadata&) = delete;

  // Copies `m` into the device buffers (asynchronous on `stream`; `m` may be freed on return).
  void upload(const StepMetadata& m, cudaStream_t stream);
  const StepMetadataView& view() const { return view_; }

 private:
  int max_tokens_, max_seqs_, max_width_;
  int32_t* buf_ = nullptr;  // positions | slots | token_seq | block_tables
  StepMetadataView view_;
};

}  // namespace m3::native
