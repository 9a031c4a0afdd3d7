// Host side of the native paged caches: per-token metadata (positions, slots, causal lengths,
// padding rows, packed block tables) from random requests, checked against the direct formulas;
// malformed requests rejected with errors naming the value; cache layout offsets and sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "core/check.h"
#include "native/kv_cache.h"
#include "native/step_metadata.h"

using namespace m3;
using namespace m3::native;

namespace {

struct Req {
  int start, n;
  std::vector<int32_t> table;
};

std::vector<SeqRows> rows_of(const std::vector<Req>& reqs) {
  std::vector<SeqRows> r(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) r[i] = SeqRows{reqs[i].start, reqs[i].n, reqs[i].table};
  return r;
}

}  // namespace

TEST(KvLayout, MetadataMatchesFormulas) {
  uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int iter = 0; iter < 20; ++iter) {
    const int bs = std::uniform_int_distribution<int>(1, 40)(gen);
    const int nreq = std::uniform_int_distribution<int>(1, 6)(gen);
    std::vector<Req> reqs(static_cast<size_t>(nreq));
    int need = 0;
    for (auto& r : reqs) {
      r.start = std::uniform_int_distribution<int>(0, 300)(gen);
      r.n = std::uniform_int_distribution<int>(1, 50)(gen);
      need += (r.start + r.n + bs - 1) / bs;
    }
    const int pool = need + 5;
    std::vector<int32_t> perm(static_cast<size_t>(pool));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    size_t next = 0;
    int live = 0;
    for (auto& r : reqs) {
      int nb = (r.start + r.n + bs - 1) / bs;
      r.table.assign(perm.begin() + ptrdiff_t(next), perm.begin() + ptrdiff_t(next + size_t(nb)));
      next += size_t(nb);
      live += r.n;
    }
    const int pad = std::uniform_int_distribution<int>(0, 7)(gen);
    auto rows = rows_of(reqs);
    StepMetadata m = build_step_metadata(rows, bs, pool, live + pad);
    ASSERT_EQ(m.num_tokens, live + pad);
    ASSERT_EQ(m.num_live, live);
    ASSERT_EQ(m.num_seqs, nreq);
    int row = 0, max_ctx = 0;
    for (int i = 0; i < nreq; ++i) {
      const Req& r = reqs[size_t(i)];
      EXPECT_EQ(m.query_start[size_t(i)], row);
      EXPECT_EQ(m.seq_lens[size_t(i)], r.start + r.n);
      for (size_t b = 0; b < size_t(m.table_width); ++b)
        EXPECT_EQ(m.block_tables[size_t(i) * size_t(m.table_width) + b], b < r.table.size() ? r.table[b] : -1);
      const int s = r.start + r.n, q = r.n;
      for (int j = 0; j < q; ++j, ++row) {
        int pos = s - q + j;
        EXPECT_EQ(m.positions[size_t(row)], pos);
        EXPECT_EQ(m.token_seq[size_t(row)], i);
        EXPECT_EQ(m.causal_len[size_t(row)], s - q + j + 1);  // the documented causal length
        EXPECT_EQ(m.slots[size_t(row)], r.table[size_t(pos / bs)] * bs + pos % bs);
        max_ctx = std::max(max_ctx, pos + 1);
      }
    }
    EXPECT_EQ(m.query_start[size_t(nreq)], live);
    EXPECT_EQ(m.max_context, max_ctx);
    for (int t = live; t < live + pad; ++t) {
      EXPECT_EQ(m.positions[size_t(t)], -1);
      EXPECT_EQ(m.slots[size_t(t)], -1);
      EXPECT_EQ(m.token_seq[size_t(t)], -1);
      EXPECT_EQ(m.causal_len[size_t(t)], 0);
    }
    // Slots of live rows are distinct and inside the pool.
    std::set<int32_t> seen(m.slots.begin(), m.slots.begin() + live);
    EXPECT_EQ(seen.size(), size_t(live));
    EXPECT_GE(*seen.begin(), 0);
    EXPECT_LT(*seen.rbegin(), pool * bs);
  }
}

TEST(KvLayout, RejectsMalformedRequests) {
  std::vector<int32_t> table = {3, 1};
  auto expect_error = [](std::vector<SeqRows> rows, int bs, int pool, int pad, const char* what) {
    try {
      build_step_metadata(rows, bs, pool, pad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // Table covers 2 blocks of 4 = positions 0..7; position 8 needs a third block.
  expect_error({SeqRows{6, 3, table}}, 4, 8, 0, "need 3");
  expect_error({SeqRows{0, 1, table}}, 4, 3, 0, "block_table[0] = 3 outside [0, 3)");
  expect_error({SeqRows{0, 0, table}}, 4, 8, 0, "0 new tokens");
  expect_error({SeqRows{-1, 1, table}}, 4, 8, 0, "start_pos -1");
  expect_error({SeqRows{0, 2, table}}, 4, 8, 1, "pad_to 1 is below the 2 live tokens");
  expect_error({SeqRows{0, 2, table}}, 0, 8, 0, "block_size must be > 0");
  // Two requests appending into the same block: slot 3*4+1 written twice.
  std::vector<int32_t> other = {3};
  expect_error({SeqRows{1, 1, table}, SeqRows{1, 1, other}}, 4, 8, 0, "slot 13 is written by two rows");
}

TEST(KvLayout, StepBatchAdapter) {
  StepBatch b;
  b.seqs.resize(2);
  b.seqs[0].start_pos = 5;
  b.seqs[0].tokens = {1, 2, 3};
  b.seqs[0].block_table = {7, 2};
  b.seqs[1].start_pos = 0;
  b.seqs[1].tokens = {9};
  b.seqs[1].block_table = {4};
  StepMetadata m = build_step_metadata(b, 4, 8, 6);
  EXPECT_EQ(m.positions, (std::vector<int32_t>{5, 6, 7, 0, -1, -1}));
  EXPECT_EQ(m.slots, (std::vector<int32_t>{2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 4 * 4 + 0, -1, -1}));
  EXPECT_EQ(m.block_tables, (std::vector<int32_t>{7, 2, 4, -1}));
}

// widen_block_tables (the decode buckets' fixed width, and the library level's decode plans): random
// requests' tables re-laid at a wider and at a narrower width keep every needed block in place,
// pad with -1, and a width below a request's needed blocks is refused naming the request.
TEST(KvLayout, WidenedTablesKeepEveryNeededBlock) {
  std::mt19937_64 rng(std::random_device{}());
  const int bs = 4;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Req> reqs(1 + rng() % 4);
    int next = 0, most = 0;
    for (auto& r : reqs) {
      r.start = int(rng() % 20);
      r.n = 1 + int(rng() % 4);
      const int need = (r.start + r.n + bs - 1) / bs;
      const int extra = int(rng() % 3);  // a table may be longer than it needs
      for (int b = 0; b < need + extra; ++b) r.table.push_back(next++);
      most = std::max(most, need);
    }
    const StepMetadata base = build_step_metadata(rows_of(reqs), bs, next, 0);
    for (int width : {most, most + 1 + int(rng() % 5)}) {
      StepMetadata m = base;
      widen_block_tables(m, width);
      ASSERT_EQ(m.table_width, width);
      ASSERT_EQ(m.block_tables.size(), reqs.size() * size_t(width));
      for (size_t i = 0; i < reqs.size(); ++i) {
        const int need = (reqs[i].start + reqs[i].n + bs - 1) / bs;
        for (int c = 0; c < width; ++c) {
          const int32_t got = m.block_tables[i * size_t(width) + size_t(c)];
          const int32_t want = c < int(reqs[i].table.size()) ? reqs[i].table[size_t(c)] : -1;
          if (c < need) ASSERT_EQ(got, want) << "request " << i << " column " << c << " (needed)";
          else ASSERT_TRUE(got == want || got == -1) << "request " << i << " column " << c << ": " << got;
        }
      }
    }
    if (most > 1) {
      StepMetadata m = base;
      try {
        widen_block_tables(m, most - 1);
        ADD_FAILURE() << "a width below a request's needed blocks was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(most) + " blocks"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(KvLayout, CacheShapeAndOffsets) {
  ModelSpec spec;
  spec.num_layers = 4;
  spec.num_kv_heads = 4;
  spec.head_dim = 128;
  spec.index_dim = 128;
  spec.index_block = 128;
  spec.attn = {AttnKind::Full, AttnKind::Sparse, AttnKind::Sparse, AttnKind::Full};
  KvCacheShape s = kv_cache_shape(spec, 10, DType::F8_E4M3, DType::BF16);
  s.validate();
  EXPECT_EQ(s.num_slots(), 1280);
  EXPECT_EQ(s.kv_bytes(), size_t(1280) * 4 * 128);
  EXPECT_EQ(s.ik_bytes(), size_t(1280) * 128 * 2);
  EXPECT_EQ(s.total_bytes(), 4 * 2 * s.kv_bytes() + 2 * s.ik_bytes());
  EXPECT_EQ(s.has_index, (std::vector<uint8_t>{0, 1, 1, 0}));
  // [num_blocks, block_size, kv_heads, head_dim]: consecutive heads of one slot are adjacent rows.
  EXPECT_EQ(kv_elem_offset(0, 1, 0, 4, 128), 128);
  EXPECT_EQ(kv_elem_offset(1, 0, 0, 4, 128), 512);
  EXPECT_EQ(kv_elem_offset(3 * 128 + 5, 2, 7, 4, 128), (int64_t(3 * 128 + 5) * 4 + 2) * 128 + 7);
  EXPECT_EQ(ik_elem_offset(129, 3, 128), 129 * 128 + 3);
  s.head_dim = 72;
  EXPECT_THROW(s.validate(), Error);
  s.head_dim = 128;
  s.kv_dtype = DType::F16;
  EXPECT_THROW(s.validate(), Error);
}
