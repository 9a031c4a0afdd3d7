// ThreadPool: every index runs exactly once for any size, grain and thread count; exceptions
// reach the caller and leave the pool usable; a nested parallel_for runs inline.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/parallel.h"

using m3::ThreadPool;

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001})
      for (int64_t grain : {0, 1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          ASSERT_LE(e - b, grain > 0 ? grain : n);
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " n " << n << " grain " << grain << " i " << i;
      }
  }
}

TEST(ThreadPool, ExceptionReachesCallerAndPoolStaysUsable) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 20; ++rep) {
    EXPECT_THROW(pool.parallel_for(100, [&](int64_t b, int64_t) {
      if (b == 40) throw std::runtime_error("boom");
    }, 10), std::runtime_error);
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    }, 7);
    EXPECT_EQ(sum.load(), 4950);
  }
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(3);
  std::atomic<int> inner{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) pool.parallel_for(10, [&](int64_t bb, int64_t ee) { inner += int(ee - bb); }, 2);
  }, 1);
  EXPECT_EQ(inner.load(), 80);
}
