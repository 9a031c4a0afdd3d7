// Scheduler and engine logic against the fake backend (test_scheduler_fake.h): chunked prefill
// within the token budget, admission control, preemption by recompute, cancellation, stop rules,
// failing steps, dispatcher fallback reasons, and the threaded engine. Outputs are compared with
// each request run alone, which the fake backend makes sensitive to any cache bookkeeping error.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/check.h"
#include "runtime/dispatcher.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "test_scheduler_fake.h"

using namespace m3;
using m3::test::FakeBackend;
using m3::test::fake_spec;

namespace {

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  int32_t stop_token = -1;
  int finals = 0;
  int completion_tokens = 0;
  int preemptions = 0;
  std::string error;
};

struct Collector {
  std::mutex mu;
  std::map<uint64_t, Result> r;
  EventCallback cb(uint64_t id) {
    return [this, id](const RequestEvent& e) {
      std::lock_guard lk(mu);
      Result& x = r[id];
      EXPECT_EQ(x.finals, 0) << "event after the final one for request " << id;
      x.tokens.insert(x.tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
      x.completion_tokens = e.completion_tokens;
      EXPECT_EQ(int(x.tokens.size()), e.completion_tokens);
      if (e.finished) {
        x.finals++;
        x.reason = e.reason;
        x.stop_token = e.stop_token;
        x.preemptions = e.preemptions;
        x.error = e.error;
      }
    };
  }
};

GenerationRequest random_request(std::mt19937& rng, int vocab, int max_prompt, int max_new) {
  GenerationRequest r;
  int len = 1 + int(rng() % unsigned(max_prompt));
  for (int i = 0; i < len; ++i) r.prompt.push_back(int32_t(rng() % unsigned(vocab)));
  r.max_tokens = 1 + int(rng() % unsigned(max_new));
  r.ignore_eos = true;
  if (rng() % 3 == 0) {  // seeded sampling must be as reproducible as greedy
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = rng();
  }
  return r;
}

void drain(Scheduler& s, int max_steps = 100000) {
  for (int i = 0; i < max_steps && s.has_work(); ++i) s.step();
  ASSERT_FALSE(s.has_work()) << "scheduler did not finish";
}

// The request run alone with plenty of cache.
Result solo(const ModelSpec& spec, const GenerationRequest& r) {
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(spec, 1024));
  Scheduler s(*d, SchedulerOptions{});
  Collector c;
  s.add(1, r, c.cb(1));
  drain(s);
  return c.r[1];
}

}  // namespace

TEST(Scheduler, ChunkedPrefillStaysWithinTheBudget) {
  auto fb = std::make_unique<FakeBackend>(fake_spec(64, 4), 64);
  FakeBackend* fake = fb.get();
  fake->record = true;
  std::unique_ptr<Backend> d(std::move(fb));
  Scheduler s(*d, SchedulerOptions{8, 8, 0});
  Collector c;
  GenerationRequest a;
  a.prompt.assign(20, 3);
  a.max_tokens = 5;
  a.ignore_eos = true;
  s.add(1, a, c.cb(1));
  GenerationRequest b = a;
  b.prompt.assign(3, 7);
  s.add(2, b, c.cb(2));
  drain(s);
  ASSERT_GE(fake->steps.size(), 3u);
  // 20-token prompt in chunks of 8, 8, 4; the second request joins the third step (4 + 3 <= 8)
  EXPECT_EQ(fake->steps[0].num_tokens(), 8);
  EXPECT_EQ(fake->steps[1].num_tokens(), 8);
  EXPECT_EQ(fake->steps[2].seqs.size(), 2u);
  EXPECT_EQ(fake->steps[2].seqs[0].start_pos, 16);
  EXPECT_EQ(fake->steps[2].seqs[1].tokens.size(), 3u);
  for (const auto& st : fake->steps) EXPECT_LE(st.num_tokens(), 8);
  EXPECT_EQ(c.r[1].tokens, solo(fake_spec(64, 4), a).tokens);
  EXPECT_EQ(c.r[2].tokens, solo(fake_spec(64, 4), b).tokens);
  EXPECT_EQ(s.blocks().num_used(), 0);
}

TEST(Scheduler, OutputDoesNotDependOnBatchOrPreemption) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const ModelSpec spec = fake_spec(50, 4);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back(random_request(rng, spec.vocab_size, 30, 20));
  std::vector<Result> alone;
  for (const auto& r : reqs) alone.push_back(solo(spec, r));

  // A small cache (every request fits alone: 50 tokens = 13 blocks), a small budget, requests
  // arriving while others run.
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(spec, 20));
  Scheduler s(*d, SchedulerOptions{6, 10, 0});
  Collector c;
  size_t next = 0;
  int steps = 0, max_used = 0;
  while (next < reqs.size() || s.has_work()) {
    for (int k = int(rng() % 3); k > 0 && next < reqs.size(); --k, ++next) s.add(next, reqs[next], c.cb(next));
    s.step();
    max_used = std::max(max_used, s.blocks().num_used());
    ASSERT_LE(s.num_running(), 6);
    ASSERT_LT(++steps, 100000);
  }
  int preemptions = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result& r = c.r[i];
    EXPECT_EQ(r.finals, 1);
    EXPECT_EQ(r.reason, FinishReason::Length);
    EXPECT_EQ(int(r.tokens.size()), reqs[i].max_tokens);
    EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i << " (preempted " << r.preemptions << " times)";
    preemptions += r.preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the cache was meant to be too small to avoid preemption";
  EXPECT_LE(max_used, 20);
  EXPECT_EQ(s.blocks().num_used(), 0);
}

TEST(Scheduler, AdmissionWaitsForBlocks) {
  const ModelSpec spec = fake_spec(64, 4);
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(spec, 6));
  Scheduler s(*d, SchedulerOptions{8, 64, 0});
  Collector c;
  GenerationRequest r;
  r.prompt.assign(11, 5);  // 11 + 1 tokens: 3 blocks to admit
  r.max_tokens = 1;
  r.ignore_eos = true;
  for (uint64_t i = 0; i < 3; ++i) s.add(i, r, c.cb(i));
  s.step();
  EXPECT_EQ(s.num_running(), 0);  // two were admitted and finished in one step (max_tokens 1)
  EXPECT_EQ(c.r.size(), 2u);
  EXPECT_EQ(s.num_waiting(), 1);
  drain(s);
  EXPECT_EQ(c.r.size(), 3u);

  // a request longer than the whole cache can never run: refused up front
  GenerationRequest big;
  big.prompt.assign(24, 1);
  big.max_tokens = 1;
  EXPECT_THROW(s.add(9, big, c.cb(9)), Error);
}

TEST(Scheduler, AdmissionRespectsMaxNumSeqs) {
  const ModelSpec spec = fake_spec(64, 4);
  auto fb = std::make_unique<FakeBackend>(spec, 256);
  FakeBackend* fake = fb.get();
  fake->record = true;
  std::unique_ptr<Backend> d(std::move(fb));
  Scheduler s(*d, SchedulerOptions{3, 512, 0});
  Collector c;
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 4;
  r.ignore_eos = true;
  for (uint64_t i = 0; i < 7; ++i) s.add(i, r, c.cb(i));
  drain(s);
  for (const auto& st : fake->steps) EXPECT_LE(st.seqs.size(), 3u);
  EXPECT_EQ(c.r.size(), 7u);
}

TEST(Scheduler, CancellationFreesBlocks) {
  const ModelSpec spec = fake_spec(64, 4);
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(spec, 12));
  Scheduler s(*d, SchedulerOptions{2, 64, 0});
  Collector c;
  GenerationRequest r;
  r.prompt.assign(6, 9);
  r.max_tokens = 30;
  r.ignore_eos = true;
  for (uint64_t i = 0; i < 3; ++i) s.add(i, r, c.cb(i));
  for (int k = 0; k < 3; ++k) s.step();
  ASSERT_EQ(s.num_running(), 2);
  ASSERT_EQ(s.num_waiting(), 1);
  int used = s.blocks().num_used();
  ASSERT_GT(used, 0);
  EXPECT_TRUE(s.cancel(0, "test"));
  EXPECT_LT(s.blocks().num_used(), used);
  EXPECT_EQ(c.r[0].reason, FinishReason::Cancelled);
  EXPECT_EQ(c.r[0].error, "test");
  EXPECT_EQ(c.r[0].finals, 1);
  EXPECT_TRUE(s.cancel(2));  // still queued
  EXPECT_EQ(c.r[2].reason, FinishReason::Cancelled);
  EXPECT_FALSE(s.cancel(2));  // already gone
  EXPECT_FALSE(s.cancel(77));
  s.cancel_all("bye");
  EXPECT_EQ(c.r[1].reason, FinishReason::Cancelled);
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(s.blocks().num_used(), 0);
}

TEST(Scheduler, StopRules) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  GenerationRequest r;
  for (int i = 0; i < 5; ++i) r.prompt.push_back(int32_t(rng() % 64));
  r.max_tokens = 12;
  r.ignore_eos = true;
  Result free_run = solo(fake_spec(64, 4), r);
  ASSERT_EQ(free_run.reason, FinishReason::Length);
  ASSERT_EQ(free_run.tokens.size(), 12u);
  const auto& T = free_run.tokens;
  auto first = [&](int32_t t) { return size_t(std::find(T.begin(), T.end(), t) - T.begin()); };

  // stop_token_ids: ends at the first occurrence, the stop token is the last output
  GenerationRequest st = r;
  st.stop_token_ids = {T[6]};
  Result a = solo(fake_spec(64, 4), st);
  EXPECT_EQ(a.reason, FinishReason::Stop);
  EXPECT_EQ(a.stop_token, T[6]);
  EXPECT_EQ(a.tokens, std::vector<int32_t>(T.begin(), T.begin() + long(first(T[6]) + 1)));

  // eos stops unless ignore_eos
  GenerationRequest e = r;
  e.ignore_eos = false;
  Result b = solo(fake_spec(64, 4, T[4]), e);
  EXPECT_EQ(b.reason, FinishReason::Stop);
  EXPECT_EQ(b.stop_token, T[4]);
  EXPECT_EQ(b.tokens.size(), first(T[4]) + 1);
  Result b2 = solo(fake_spec(64, 4, T[4]), r);
  EXPECT_EQ(b2.tokens, T);

  // the context limit ends a request with "length" even before max_tokens
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(fake_spec(64, 4, -1, 4096), 64));
  Scheduler s(*d, SchedulerOptions{4, 64, 9});
  Collector c;
  GenerationRequest l = r;
  l.max_tokens = 4;  // 5 + 4 = 9 = max_model_len
  s.add(1, l, c.cb(1));
  drain(s);
  EXPECT_EQ(c.r[1].reason, FinishReason::Length);
  EXPECT_EQ(c.r[1].tokens.size(), 4u);
}

TEST(Scheduler, ValidationNamesTheProblem) {
  std::unique_ptr<Backend> d(std::make_unique<FakeBackend>(fake_spec(64, 4), 8));  // 32 positions
  Scheduler s(*d, SchedulerOptions{});
  EXPECT_EQ(s.max_model_len(), 32);
  auto expect_error = [&](GenerationRequest r, const std::string& needle) {
    try {
      s.validate(r);
      ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  GenerationRequest ok;
  ok.prompt = {1, 2};
  ok.max_tokens = 3;
  EXPECT_NO_THROW(s.validate(ok));
  GenerationRequest r = ok;
  r.prompt.clear();
  expect_error(r, "empty");
  r = ok;
  r.prompt[1] = 64;
  expect_error(r, "prompt[1] = 64");
  r = ok;
  r.prompt[0] = -1;
  expect_error(r, "prompt[0] = -1");
  r = ok;
  r.max_tokens = 0;
  expect_error(r, "max_tokens");
  r = ok;
  r.max_tokens = 31;
  expect_error(r, "maximum context of 32");
  r = ok;
  r.sampling.temperature = -1;
  expect_error(r, "temperature");
  r = ok;
  r.sampling.top_p = 0;
  expect_error(r, "top_p");
  r = ok;
  r.stop_token_ids = {70};
  expect_error(r, "stop_token_ids[0] = 70");
  EXPECT_THROW(Scheduler(*d, SchedulerOptions{4, 64, 33}), Error);  // more than the cache holds
}

TEST(Scheduler, FailingStepFailsItsRequestsAndKeepsGoing) {
  auto fb = std::make_unique<FakeBackend>(fake_spec(64, 4), 32);
  FakeBackend* fake = fb.get();
  std::unique_ptr<Backend> d(std::move(fb));
  Scheduler s(*d, SchedulerOptions{});
  Collector c;
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 3;
  r.ignore_eos = true;
  fake->before_step = [](const StepBatch&) { throw Error("injected failure"); };
  s.add(1, r, c.cb(1));
  s.add(2, r, c.cb(2));
  StepReport rep = s.step();
  EXPECT_NE(rep.error.find("injected failure"), std::string::npos);
  EXPECT_EQ(c.r[1].reason, FinishReason::Error);
  EXPECT_EQ(c.r[2].reason, FinishReason::Error);
  EXPECT_EQ(s.blocks().num_used(), 0);
  fake->before_step = nullptr;
  s.add(3, r, c.cb(3));
  drain(s);
  EXPECT_EQ(c.r[3].reason, FinishReason::Length);
  EXPECT_EQ(c.r[3].tokens, solo(fake_spec(64, 4), r).tokens);
}

// The backend chooses its path per step (a Dispatcher inside it, as CudaBackend does with the mono
// runner); the scheduler reports what the backend says it ran, and a refused step never stops a
// later one from taking the preferred path.
TEST(Dispatcher, PreferredPathRefusalsAreRecorded) {
  const ModelSpec spec = fake_spec(64, 4);
  auto fb = std::make_unique<FakeBackend>(spec, 64);
  Dispatcher paths;
  paths.add_preferred_path("mono", [](const StepBatch& b) { return mono_batch_refusal(b, 4); });
  EXPECT_EQ(paths.path_names(), (std::vector<std::string>{"mono", "native"}));
  fb->paths = &paths;
  Scheduler s(*fb, SchedulerOptions{8, 64, 0});
  Collector c;
  GenerationRequest r;
  r.prompt = {4, 5, 6};
  r.max_tokens = 3;
  r.ignore_eos = true;
  for (uint64_t i = 0; i < 6; ++i) s.add(i, r, c.cb(i));
  StepReport a = s.step();  // prefill of 6
  EXPECT_EQ(a.path, "native");
  EXPECT_EQ(a.fallback_reason, "mono:prefill");
  StepReport b = s.step();  // 6 decodes
  EXPECT_EQ(b.path, "native");
  EXPECT_EQ(b.fallback_reason, "mono:batch_too_large");
  s.cancel(0);
  s.cancel(1);
  StepReport e = s.step();  // 4 decodes
  EXPECT_EQ(e.path, "mono");
  EXPECT_EQ(e.fallback_reason, "");
  drain(s);
  EXPECT_EQ(c.r[5].tokens, solo(spec, r).tokens);
  // every step counted once, under the path that ran it and the reason the preferred one declined
  uint64_t steps = 0;
  for (const auto& [name, n] : paths.steps_by_path()) steps += n;
  EXPECT_EQ(steps, fb->steps_run);
  EXPECT_EQ(paths.steps_by_path().at("native"), 2u);
  EXPECT_EQ(paths.steps_by_path().at("mono"), fb->steps_run - 2);
  EXPECT_EQ(paths.fallbacks().at("mono:prefill"), 1u);
  EXPECT_EQ(paths.fallbacks().at("mono:batch_too_large"), 1u);
  EXPECT_THROW(paths.add_preferred_path("mono", [](const StepBatch&) { return std::string(); }), Error);
  EXPECT_THROW(paths.add_preferred_path("other", Eligibility{}), Error);
}

TEST(Engine, ThreadedSubmitCancelAndShutdown) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ModelSpec spec = fake_spec(40, 4);
  EngineOptions eo;
  eo.scheduler = SchedulerOptions{5, 12, 0};
  Engine engine(std::make_unique<FakeBackend>(spec, 24), eo);
  Collector c;
  std::mutex mu;
  std::map<uint64_t, GenerationRequest> submitted;
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      std::mt19937 rng(seed + unsigned(t));
      for (int i = 0; i < 10; ++i) {
        GenerationRequest r = random_request(rng, spec.vocab_size, 20, 15);
        std::lock_guard lk(mu);  // so the callback's id is known before the first event
        uint64_t id = engine.submit(r, [&c](const RequestEvent& ev) { c.cb(ev.id)(ev); });
        submitted[id] = r;
      }
    });
  for (auto& th : clients) th.join();
  ASSERT_TRUE(engine.wait_idle(std::chrono::seconds(30)));
  for (const auto& [id, r] : submitted) {
    std::lock_guard lk(c.mu);
    EXPECT_EQ(c.r[id].finals, 1);
    EXPECT_EQ(c.r[id].tokens, solo(spec, r).tokens) << "request " << id;
  }
  EngineStats st = engine.stats();
  EXPECT_EQ(st.cache_blocks_used, 0);
  EXPECT_EQ(st.requests_submitted, 40u);
  EXPECT_EQ(st.requests_finished["length"], 40u);
  EXPECT_GT(st.steps, 0u);
  EXPECT_EQ(st.step_latency.count, st.steps);
  EXPECT_EQ(st.steps_by_path["native"], st.steps);

  // cancel from another thread, then a shutdown that cancels what is left
  GenerationRequest longr;
  longr.prompt = {1, 2, 3};
  longr.max_tokens = 90;
  longr.ignore_eos = true;
  uint64_t a = engine.submit(longr, c.cb(1000));
  uint64_t b = engine.submit(longr, c.cb(1001));
  std::thread([&] { engine.cancel(a, "by test"); }).join();
  engine.shutdown(std::chrono::milliseconds(0));
  EXPECT_THROW(engine.submit(longr, c.cb(1002)), Error);
  std::lock_guard lk(c.mu);
  EXPECT_EQ(c.r[1000].finals, 1);
  EXPECT_EQ(c.r[1001].finals, 1);
  (void)b;
  EXPECT_EQ(engine.stats().cache_blocks_used, 0);
  EXPECT_EQ(engine.stats().running + engine.stats().waiting, 0);
}
