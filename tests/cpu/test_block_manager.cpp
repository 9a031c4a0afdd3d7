// BlockManager: allocation covers exactly the positions asked for, exhaustion is all-or-nothing,
// every block comes back (no leaks, no duplicates), misuse throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/check.h"
#include "runtime/block_manager.h"

using namespace m3;

TEST(BlockManager, AllocatesWhatPositionsNeed) {
  BlockManager bm(10, 4);
  EXPECT_EQ(bm.blocks_for(0), 0);
  EXPECT_EQ(bm.blocks_for(1), 1);
  EXPECT_EQ(bm.blocks_for(4), 1);
  EXPECT_EQ(bm.blocks_for(5), 2);
  std::vector<int32_t> t;
  ASSERT_TRUE(bm.ensure(t, 5));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(bm.num_used(), 2);
  ASSERT_TRUE(bm.ensure(t, 8));  // still two blocks
  EXPECT_EQ(t.size(), 2u);
  ASSERT_TRUE(bm.ensure(t, 9));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(bm.blocks_missing(t, 20), 2);
  bm.release(t);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(bm.num_free(), 10);
}

TEST(BlockManager, ExhaustionIsAllOrNothing) {
  BlockManager bm(5, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(bm.ensure(a, 6));  // 3 blocks
  EXPECT_FALSE(bm.ensure(b, 6));  // needs 3, 2 free
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(bm.num_free(), 2);
  ASSERT_TRUE(bm.ensure(b, 4));
  EXPECT_EQ(bm.num_free(), 0);
  EXPECT_FALSE(bm.ensure(a, 7));
  EXPECT_EQ(a.size(), 3u);
  bm.release(a);
  EXPECT_TRUE(bm.ensure(b, 10));
  EXPECT_EQ(bm.num_free(), 0);
}

TEST(BlockManager, RandomTrafficNeverLeaksOrSharesBlocks) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int nblocks = 37, bs = 3;
  BlockManager bm(nblocks, bs);
  std::vector<std::vector<int32_t>> tables(8);
  std::vector<int64_t> lens(8, 0);
  for (int it = 0; it < 5000; ++it) {
    size_t i = rng() % tables.size();
    if (rng() % 5 == 0) {
      bm.release(tables[i]);
      lens[i] = 0;
    } else {
      int64_t want = lens[i] + int64_t(rng() % 7);
      int before_free = bm.num_free();
      int missing = bm.blocks_missing(tables[i], want);
      bool ok = bm.ensure(tables[i], want);
      ASSERT_EQ(ok, missing <= before_free);
      if (ok) lens[i] = want;
      ASSERT_EQ(bm.num_free(), ok ? before_free - missing : before_free);
    }
    // every owned block is in exactly one table, and the counts add up
    std::set<int32_t> seen;
    size_t owned = 0;
    for (size_t k = 0; k < tables.size(); ++k) {
      ASSERT_EQ(int64_t(tables[k].size()), bm.blocks_for(lens[k])) << "table " << k;
      for (int32_t b : tables[k]) {
        ASSERT_TRUE(b >= 0 && b < nblocks);
        ASSERT_TRUE(seen.insert(b).second) << "block " << b << " in two tables";
      }
      owned += tables[k].size();
    }
    ASSERT_EQ(int(owned), bm.num_used());
  }
  for (auto& t : tables) bm.release(t);
  EXPECT_EQ(bm.num_free(), nblocks);
  EXPECT_EQ(bm.num_used(), 0);
}

TEST(BlockManager, MisuseThrows) {
  EXPECT_THROW(BlockManager(0, 4), Error);
  EXPECT_THROW(BlockManager(4, 0), Error);
  BlockManager bm(4, 4);
  std::vector<int32_t> t;
  ASSERT_TRUE(bm.ensure(t, 4));
  std::vector<int32_t> copy = t;
  bm.release(t);
  EXPECT_THROW(bm.release(copy), Error);  // double free
  std::vector<int32_t> foreign{99};
  EXPECT_THROW(bm.release(foreign), Error);
  EXPECT_THROW(bm.blocks_for(-1), Error);
}
