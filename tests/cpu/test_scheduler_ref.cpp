// The scheduler on the real CPU reference backend (tiny synthetic MiniMax-M3, block 16, sparse
// window 4 x 16 tokens): a request's output must be the same tokens whether it runs alone or in
// mixed, chunked, preempted batches (the reference is deterministic per row), for greedy and for
// seeded sampling; and the threaded engine gives the same answers under concurrent submission.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>

#include "common/tiny_reference.h"
#include "model/synthetic.h"
#include "ref/engine.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"

using namespace m3;

namespace {

using test::tiny;

struct Out {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  int preemptions = 0;
  std::string error;
};
EventCallback collect(std::map<uint64_t, Out>& m, std::mutex& mu, uint64_t id) {
  return [&m, &mu, id](const RequestEvent& e) {
    std::lock_guard lk(mu);
    Out& o = m[id];
    o.tokens.insert(o.tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
    if (e.finished) {
      o.reason = e.reason;
      o.preemptions = e.preemptions;
      o.error = e.error;
    }
  };
}

std::vector<GenerationRequest> random_requests(std::mt19937& rng, int n) {
  std::vector<GenerationRequest> v;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    // lengths below, at and above the 64-token sparse window
    int len = 1 + int(rng() % 100u);
    for (int k = 0; k < len; ++k) r.prompt.push_back(int32_t(rng() % 1024u));
    r.max_tokens = 4 + int(rng() % 5u);
    r.ignore_eos = true;
    if (i % 3 == 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 50;
      r.sampling.seed = rng();
    }
    v.push_back(std::move(r));
  }
  return v;
}

}  // namespace

TEST(SchedulerRef, SameTokensAloneAndInChunkedPreemptedBatches) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto reqs = random_requests(rng, 7);
  std::mutex mu;

  // alone: one request at a time through one scheduler with plenty of cache
  std::map<uint64_t, Out> alone;
  {
    std::unique_ptr<Backend> d(tiny().backend(64));
    Scheduler s(*d, SchedulerOptions{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      s.add(i, reqs[i], collect(alone, mu, i));
      while (s.has_work()) s.step();
      ASSERT_EQ(alone[i].reason, FinishReason::Length) << alone[i].error;
    }
  }

  // together: staggered arrivals, 24-token steps (prefill chunks share steps with decodes), and
  // 12 blocks (192 positions) for up to ~750 tokens of live sequences, so requests get preempted
  std::map<uint64_t, Out> mixed;
  std::unique_ptr<Backend> d(tiny().backend(12));
  Scheduler s(*d, SchedulerOptions{6, 24, 0});
  size_t next = 0;
  int steps = 0;
  while (next < reqs.size() || s.has_work()) {
    if (next < reqs.size() && (rng() % 2 == 0 || !s.has_work())) {
      s.add(next, reqs[next], collect(mixed, mu, next));
      ++next;
    }
    s.step();
    ASSERT_LT(++steps, 5000);
  }
  int preemptions = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(mixed[i].reason, FinishReason::Length) << mixed[i].error;
    EXPECT_EQ(int(mixed[i].tokens.size()), reqs[i].max_tokens);
    EXPECT_EQ(mixed[i].tokens, alone[i].tokens)
        << "request " << i << " (prompt " << reqs[i].prompt.size() << " tokens, "
        << (reqs[i].sampling.temperature > 0 ? "sampled" : "greedy") << ", preempted " << mixed[i].preemptions
        << " times)";
    preemptions += mixed[i].preemptions;
  }
  RecordProperty("preemptions", preemptions);
  EXPECT_EQ(s.blocks().num_used(), 0);
}

TEST(SchedulerRef, PreemptedRequestResumesWithTheSameTokens) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // 4 blocks of 16. A (30 + 20 tokens) and B (20 + 20, seeded sampling) are both admitted (2 + 2
  // blocks); when A reaches position 32 it needs a third block, so B (the newest) is preempted,
  // and recomputed after A finishes. B's draws must continue where they stopped.
  std::vector<GenerationRequest> reqs(2);
  for (int k = 0; k < 30; ++k) reqs[0].prompt.push_back(int32_t(rng() % 1024u));
  for (int k = 0; k < 20; ++k) reqs[1].prompt.push_back(int32_t(rng() % 1024u));
  for (auto& r : reqs) {
    r.max_tokens = 20;
    r.ignore_eos = true;
  }
  reqs[1].sampling.temperature = 1.0f;
  reqs[1].sampling.seed = rng();
  std::mutex mu;
  std::map<uint64_t, Out> alone, mixed;
  {
    std::unique_ptr<Backend> d(tiny().backend(64));
    Scheduler s(*d, SchedulerOptions{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      s.add(i, reqs[i], collect(alone, mu, i));
      while (s.has_work()) s.step();
    }
  }
  std::unique_ptr<Backend> d(tiny().backend(4));
  Scheduler s(*d, SchedulerOptions{4, 64, 0});
  for (size_t i = 0; i < reqs.size(); ++i) s.add(i, reqs[i], collect(mixed, mu, i));
  for (int k = 0; k < 1000 && s.has_work(); ++k) s.step();
  EXPECT_EQ(mixed[0].preemptions, 0);
  EXPECT_GE(mixed[1].preemptions, 1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(mixed[i].reason, FinishReason::Length) << mixed[i].error;
    EXPECT_EQ(mixed[i].tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_EQ(s.blocks().num_used(), 0);
}

TEST(SchedulerRef, EngineUnderConcurrentSubmissionMatchesAlone) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto reqs = random_requests(rng, 6);
  std::mutex mu;
  std::map<uint64_t, Out> alone, together;
  {
    std::unique_ptr<Backend> d(tiny().backend(64));
    Scheduler s(*d, SchedulerOptions{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      s.add(i, reqs[i], collect(alone, mu, i));
      while (s.has_work()) s.step();
    }
  }
  Engine engine(tiny().backend(64), EngineOptions{SchedulerOptions{8, 64, 0}});
  std::map<uint64_t, size_t> which;
  {
    std::vector<std::thread> th;
    for (size_t i = 0; i < reqs.size(); ++i)
      th.emplace_back([&, i] {
        std::lock_guard lk(mu);  // the id is recorded before the first event can arrive
        which[engine.submit(reqs[i], collect(together, mu, 100 + i))] = i;
      });
    for (auto& t : th) t.join();
  }
  ASSERT_TRUE(engine.wait_idle(std::chrono::seconds(60)));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[100 + i].tokens, alone[i].tokens) << "request " << i;
  EngineStats st = engine.stats();
  EXPECT_EQ(st.cache_blocks_used, 0);
  EXPECT_GT(st.batch_size.count, 0u);
  engine.shutdown(std::chrono::milliseconds(0));
}
