// Which steps the decode buckets run (decode and verify rows) and where each output row sits in
// the bucket (native/bucket_rows.h): random batches against a direct per-row walk.
#include <gtest/gtest.h>

#include <random>

#include "native/bucket_rows.h"

using namespace m3;
using namespace m3::native;

namespace {

StepBatch batch_of(const std::vector<int>& lens, const std::vector<bool>& all) {
  StepBatch b;
  for (size_t i = 0; i < lens.size(); ++i) {
    SeqStep s;
    s.tokens.assign(size_t(lens[i]), 7);
    s.all_logits = all[i];
    b.seqs.push_back(s);
  }
  return b;
}

}  // namespace

TEST(BucketRows, DecodeBucketIsThePowerOfTwoAbove) {
  const int want[] = {1, 2, 4, 4, 8, 8, 8, 8, 16};
  for (int n = 1; n <= 9; ++n) EXPECT_EQ(decode_bucket(n), want[n - 1]) << n;
  EXPECT_THROW(decode_bucket(0), Error);
}

TEST(BucketRows, WhichStepsRunInABucket) {
  const BucketLimits lim{8, 64, 32};
  EXPECT_EQ(bucket_query_len(batch_of({1, 1, 1}, {false, false, false}), lim, false), 1);
  EXPECT_EQ(bucket_query_len(batch_of({4, 4}, {true, false}), lim, false), 4);
  EXPECT_EQ(bucket_query_len(batch_of({3, 3, 3}, {true, true, true}), lim, true), 0);
}

TEST(BucketRows, RulesAndLimits) {
  auto q_of = [&](std::vector<int> lens, bool traced = false, BucketLimits l = {8, 64, 32}) {
    return bucket_query_len(batch_of(lens, std::vector<bool>(lens.size(), false)), l, traced);
  };
  EXPECT_EQ(q_of({1}), 1);
  EXPECT_EQ(q_of({2, 2, 2}), 2);                 // 3 rows -> bucket 4, 8 token rows
  EXPECT_EQ(q_of({4, 4, 4, 4, 4, 4, 4, 4}), 4);  // 8 rows x 4 = 32 = logits_rows
  EXPECT_EQ(q_of({5}), 0);                       // more than kMaxBucketQuery: a prefill chunk
  EXPECT_EQ(q_of({2, 3}), 0);                    // uneven
  EXPECT_EQ(q_of({1, 1}, true), 0);              // traced steps run eagerly
  EXPECT_EQ(q_of(std::vector<int>(9, 1)), 0);    // more rows than max_graph_batch
  EXPECT_EQ(q_of({}), 0);
  EXPECT_EQ(q_of({4, 4, 4, 4, 4}, false, BucketLimits{8, 64, 16}), 0);  // 8 x 4 rows > logits_rows
  EXPECT_EQ(q_of({4, 4, 4, 4, 4}, false, BucketLimits{8, 16, 64}), 0);  // > max_tokens
  EXPECT_EQ(q_of({2, 2, 2, 2}, false, BucketLimits{8, 8, 8}), 2);        // exactly fits
}

// Random batches: each sequence's output rows (its last, or all q with all_logits) must come out
// at consecutive output rows in order, read from bucket rows i q + j, with runs merged maximally.
TEST(BucketRows, OutputRunsMapEveryRow) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + int(rng() % 8), q = 1 + int(rng() % kMaxBucketQuery);
    std::vector<bool> all(static_cast<size_t>(n), false);
    for (auto&& a : all) a = rng() % 2;
    const StepBatch b = batch_of(std::vector<int>(size_t(n), q), all);
    // expected: output row -> bucket row
    std::vector<int> want;
    for (int i = 0; i < n; ++i)
      for (int j = all[size_t(i)] ? 0 : q - 1; j < q; ++j) want.push_back(i * q + j);
    std::vector<int> got(want.size(), -1);
    const auto runs = bucket_output_runs(b, q);
    int next_out = 0;
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].out_row, next_out) << "trial " << trial << " run " << r;
      ASSERT_GT(runs[r].count, 0);
      if (r > 0) EXPECT_NE(runs[r - 1].bucket_row + runs[r - 1].count, runs[r].bucket_row) << "runs not merged";
      for (int k = 0; k < runs[r].count; ++k) {
        ASSERT_LT(size_t(runs[r].out_row + k), got.size());
        got[size_t(runs[r].out_row + k)] = runs[r].bucket_row + k;
      }
      next_out += runs[r].count;
    }
    ASSERT_EQ(got, want) << "trial " << trial << ", " << n << " rows of " << q;
    if (q == 1) EXPECT_EQ(runs.size(), 1u) << "decode rows are one run";
  }
}
