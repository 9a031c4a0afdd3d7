// Speculative decoding (runtime/speculative.h, the scheduler's verify rows): n-gram drafts against
// a brute-force search, greedy acceptance, the rejection-sampling acceptance's output distribution
// against the target's (statistically), and the scheduler on the CPU reference: greedy outputs
// identical with and without speculation, alone and in mixed batches, with cache blocks all back
// at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "common/tiny_reference.h"
#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"
#include "serve/metrics.h"

using namespace m3;

namespace {

// The reference search: every n from max to min, every start from the latest.
std::vector<int32_t> brute_drafts(const std::vector<int32_t>& t, int lo, int hi, int k) {
  const int L = int(t.size());
  for (int n = hi; n >= lo; --n) {
    if (n >= L) continue;
    for (int i = L - n - 1; i >= 0; --i) {
      bool eq = true;
      for (int j = 0; j < n; ++j) eq = eq && t[size_t(i + j)] == t[size_t(L - n + j)];
      if (!eq) continue;
      std::vector<int32_t> d;
      for (int j = i + n; j < L && int(d.size()) < k; ++j) d.push_back(t[size_t(j)]);
      return d;
    }
  }
  return {};
}

}  // namespace

TEST(Speculative, NgramDraftsExamples) {
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{1, 2, 3, 4, 1, 2}, 1, 4, 3), (std::vector<int32_t>{3, 4, 1}));
  // the latest earlier occurrence wins
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{5, 6, 9, 5, 6, 7, 5, 6}, 2, 2, 3), (std::vector<int32_t>{7, 5, 6}));
  // a longer match first: [8, 5, 6] occurs at 0, so 9 follows (not the 2-gram's 7)
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{8, 5, 6, 9, 5, 6, 7, 8, 5, 6}, 1, 3, 1), (std::vector<int32_t>{9}));
  // the continuation stops at the end of the sequence
  EXPECT_EQ(ngram_drafts(std::vector<int32_t>{7, 7, 7}, 1, 2, 3), (std::vector<int32_t>{7}));
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 2, 3}, 1, 4, 3).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{4}, 1, 4, 3).empty());
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 2, 1, 2}, 3, 4, 3).empty()) << "no 3- or 4-gram repeats";
  EXPECT_TRUE(ngram_drafts(std::vector<int32_t>{1, 1, 1}, 1, 4, 0).empty());
}

TEST(Speculative, NgramDraftsMatchBruteForce) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> t(1 + rng() % (trial % 10 == 0 ? 300 : 40));
    const unsigned alphabet = 2 + rng() % 6;  // small alphabets: many repeats
    for (auto& x : t) x = int32_t(rng() % alphabet);
    const int lo = 1 + int(rng() % 3), hi = lo + int(rng() % 4), k = 1 + int(rng() % 3);
    ASSERT_EQ(ngram_drafts(t, lo, hi, k), brute_drafts(t, lo, hi, k)) << "trial " << trial;
  }
}

// A long request (the search is one backward pass): a planted earlier occurrence of the last 4
// tokens in 100K random ones is found, and the result equals the brute-force search's.
TEST(Speculative, NgramDraftsOnALongSequence) {
  std::mt19937 rng(std::random_device{}());
  std::vector<int32_t> t(100000);
  for (auto& x : t) x = int32_t(rng() % 50000u);
  const std::vector<int32_t> tail{t[t.size() - 4], t[t.size() - 3], t[t.size() - 2], t[t.size() - 1]};
  std::copy(tail.begin(), tail.end(), t.begin() + 1234);  // tokens 1238.. follow the planted copy
  const auto d = ngram_drafts(t, 1, 4, 3);
  EXPECT_EQ(d, brute_drafts(t, 1, 4, 3));
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d, (std::vector<int32_t>{t[1238], t[1239], t[1240]}));
}

TEST(Speculative, OptionsAreChecked) {
  SpeculativeOptions o;
  o.method = SpeculativeMethod::Ngram;
  EXPECT_NO_THROW(validate_speculative(o));
  o.num_draft_tokens = 4;
  EXPECT_THROW(validate_speculative(o), Error);
  o.num_draft_tokens = 0;
  EXPECT_THROW(validate_speculative(o), Error);
  o.num_draft_tokens = 2;
  o.ngram_min = 3;
  o.ngram_max = 2;
  try {
    validate_speculative(o);
    ADD_FAILURE() << "n-gram lengths [3, 2] accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_speculative_method("ngram"), SpeculativeMethod::Ngram);
  EXPECT_EQ(parse_speculative_method("none"), SpeculativeMethod::None);
  EXPECT_THROW(parse_speculative_method("eagle9"), Error);
}

TEST(Speculative, GreedyAcceptance) {
  using V = std::vector<int32_t>;
  EXPECT_EQ(accept_greedy(V{4, 5, 6}, V{4, 5, 6, 7}), (V{4, 5, 6, 7}));  // all kept, plus one
  EXPECT_EQ(accept_greedy(V{4, 5, 6}, V{4, 9, 6, 7}), (V{4, 9}));        // the first mismatch ends it
  EXPECT_EQ(accept_greedy(V{4, 5, 6}, V{3, 5, 6, 7}), (V{3}));
  EXPECT_EQ(accept_greedy(V{}, V{8}), (V{8}));
  EXPECT_THROW(accept_greedy(V{1}, V{1}), Error);
  // verify_drafts at temperature 0: argmax of each row (rows built with a known argmax)
  const int vocab = 50;
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int m = int(rng() % 4);
    V drafts, best;
    std::vector<float> rows(size_t(m + 1) * vocab);
    for (auto& x : rows) x = float(rng() % 1000) / 100.0f;
    for (int i = 0; i <= m; ++i) {
      best.push_back(int32_t(rng() % vocab));
      rows[size_t(i) * vocab + size_t(best.back())] = 20.0f;
      if (i < m) drafts.push_back(rng() % 3 ? best.back() : int32_t(rng() % vocab));
    }
    SamplerState st{7, 0};
    const VerifyResult r = verify_drafts(rows.data(), vocab, drafts, SamplingParams{}, st);
    EXPECT_EQ(r.tokens, accept_greedy(drafts, best)) << "trial " << trial;
    EXPECT_EQ(r.accepted, int(r.tokens.size()) - 1);
    EXPECT_EQ(st.draws, 0u) << "greedy draws nothing";
  }
}

// Rejection-sampling acceptance: over many seeds, the first token's distribution and the second's
// (given the first draft was kept) must be the target's, for drafts the target likes, dislikes or
// gives no mass (top-k cuts it). Tolerance: total variation < 0.02 over 40000 draws (the expected
// TV of an empirical distribution of 8 outcomes at n = 40000 is about 0.006).
TEST(Speculative, RejectionSamplingKeepsTheTargetDistribution) {
  const int vocab = 8;
  const std::vector<float> row0{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f, 0.2f, -3.0f};
  const std::vector<float> row1{0.0f, 3.0f, 0.1f, 1.0f, 1.0f, -2.0f, 0.5f, 0.0f};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 6;
  auto target = [&](const std::vector<float>& row) {
    std::vector<double> t(vocab, 0.0);
    for (const auto& [id, prob] : sampling_distribution(row.data(), vocab, p)) t[size_t(id)] = prob;
    return t;
  };
  const auto p0 = target(row0), p1 = target(row1);
  std::vector<float> rows(row0);
  rows.insert(rows.end(), row1.begin(), row1.end());
  const uint64_t base = std::random_device{}();
  SCOPED_TRACE("seed base " + std::to_string(base));
  for (int32_t draft : {0, 2, 7}) {  // likely, unlikely, cut by top-k (probability 0)
    const int n = 40000;
    std::vector<double> first(vocab, 0.0), second(vocab, 0.0);
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      SamplerState st{base + uint64_t(i) * 7919u, 0};
      const std::vector<int32_t> drafts{draft};
      const VerifyResult r = verify_drafts(rows.data(), vocab, drafts, p, st);
      ASSERT_FALSE(r.tokens.empty());
      first[size_t(r.tokens[0])] += 1.0 / n;
      if (r.accepted == 1) {
        ASSERT_EQ(r.tokens.size(), 2u);
        ASSERT_EQ(r.tokens[0], draft);
        second[size_t(r.tokens[1])] += 1.0;
        ++kept;
      } else {
        ASSERT_EQ(r.tokens.size(), 1u);
        ASSERT_NE(r.tokens[0], draft);
      }
    }
    double tv0 = 0, tv1 = 0;
    for (int v = 0; v < vocab; ++v) tv0 += std::abs(first[size_t(v)] - p0[size_t(v)]) / 2;
    EXPECT_LT(tv0, 0.02) << "draft " << draft << ": first token off the target distribution";
    EXPECT_NEAR(double(kept) / n, p0[size_t(draft)], 0.02) << "draft " << draft << " kept at its probability";
    if (kept > 2000) {
      for (int v = 0; v < vocab; ++v) tv1 += std::abs(second[size_t(v)] / kept - p1[size_t(v)]) / 2;
      EXPECT_LT(tv1, 0.03) << "draft " << draft << ": the token after a kept draft";
    }
  }
}

namespace {

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  std::string error;
};

// Runs the requests through one scheduler (all at once, max_num_seqs rows) and returns each one's
// tokens and the step reports summed.
std::vector<Collected> run_all(const std::vector<GenerationRequest>& reqs, SchedulerOptions o, int blocks,
                               StepReport* sum, int* free_after) {
  std::unique_ptr<Backend> d(test::tiny().backend(blocks));
  Scheduler s(*d, o);
  std::vector<Collected> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    s.add(i, reqs[i], [&out, i](const RequestEvent& e) {
      out[i].tokens.insert(out[i].tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
      if (e.finished) {
        out[i].reason = e.reason;
        out[i].error = e.error;
      }
    });
  int steps = 0;
  while (s.has_work()) {
    const StepReport r = s.step();
    sum->verify_rows += r.verify_rows;
    sum->drafted += r.drafted;
    sum->accepted += r.accepted;
    sum->generated += r.generated;
    sum->preempted += r.preempted;
    EXPECT_LT(++steps, 20000);
    if (steps >= 20000) break;
  }
  *free_after = s.blocks().num_free();
  return out;
}

}  // namespace

// Greedy speculation gives exactly the tokens of plain decoding (the CPU reference's logits of a
// token do not depend on the other tokens of its step), alone and batched, with prompts that
// repeat (drafts found and kept) and random ones (drafts rejected), stop tokens and short
// max_tokens cutting verify rows; every cache block is back at the end.
TEST(Speculative, GreedyOutputsEqualPlainDecodingOnTheReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    if (i % 2 == 0) {  // a pattern repeated: n-gram drafts from the prompt
      std::vector<int32_t> pat(3 + rng() % 4);
      for (auto& x : pat) x = int32_t(rng() % 1024u);
      for (int k = 0; k < 6; ++k) r.prompt.insert(r.prompt.end(), pat.begin(), pat.end());
    } else {
      for (int k = 0, n = 5 + int(rng() % 60); k < n; ++k) r.prompt.push_back(int32_t(rng() % 1024u));
    }
    r.max_tokens = 12 + int(rng() % 30);
    r.ignore_eos = true;
    if (i == 3) r.max_tokens = 2;  // room for at most one draft
    reqs.push_back(std::move(r));
  }
  SchedulerOptions plain;
  plain.max_num_seqs = 4;
  StepReport s0, s1, s2;
  int free0 = 0, free1 = 0, free2 = 0;
  const auto want = run_all(reqs, plain, 64, &s0, &free0);
  // a stop token that occurs in the plain output of request 0 (cuts a verify row in the middle)
  ASSERT_GE(want[0].tokens.size(), 6u);
  std::vector<GenerationRequest> stopped = reqs;
  stopped[0].stop_token_ids = {want[0].tokens[5]};
  for (int k = 1; k <= kMaxDraftTokens; ++k) {
    SchedulerOptions spec = plain;
    spec.speculative.method = SpeculativeMethod::Ngram;
    spec.speculative.num_draft_tokens = k;
    spec.speculative.ngram_min = 1;
    spec.speculative.ngram_max = 3;
    const auto got = run_all(reqs, spec, 64, &s1, &free1);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << ", k " << k << ": " << got[i].error;
      EXPECT_EQ(got[i].reason, FinishReason::Length) << "request " << i;
    }
    EXPECT_EQ(free1, 64) << "cache blocks not all back, k " << k;
    // alone (one row a step) and with the stop token
    SchedulerOptions one = spec;
    one.max_num_seqs = 1;
    const auto alone = run_all(stopped, one, 64, &s2, &free2);
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::vector<int32_t> w = want[i].tokens;
      if (i == 0)  // up to and with the stop token's first occurrence
        w.resize(size_t(std::find(w.begin(), w.end(), stopped[0].stop_token_ids[0]) - w.begin()) + 1);
      EXPECT_EQ(alone[i].tokens, w) << "request " << i << " alone, k " << k;
    }
    EXPECT_EQ(alone[0].reason, FinishReason::Stop);
    EXPECT_EQ(free2, 64);
  }
  EXPECT_EQ(free0, 64);
  EXPECT_EQ(s0.verify_rows, 0);
  EXPECT_GT(s1.verify_rows, 0) << "no verify rows ran";
  EXPECT_GT(s1.accepted, 0) << "no draft was ever kept (" << s1.drafted << " drafted)";
  EXPECT_LT(s1.accepted, s1.drafted) << "every draft kept: the random prompts should reject some";
  std::printf("  [speculative ngram] %d verify rows, %d drafts, %d kept (acceptance length %.2f)\n", s1.verify_rows,
              s1.drafted, s1.accepted, 1.0 + double(s1.accepted) / std::max(1, s1.verify_rows));
}

// A cache that holds the four requests' final lengths exactly (3 blocks each): drafts never take a
// block another request needs (no preemption, as without them), and the outputs stay those of
// plain decoding.
TEST(Speculative, DraftsDoNotPreemptInATightCache) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 5; ++k) r.prompt.insert(r.prompt.end(), {int32_t(10 + i), 20, 30});
    r.max_tokens = 20;
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  SchedulerOptions plain;
  plain.max_num_seqs = 4;
  StepReport a, b;
  int fa = 0, fb = 0;
  const auto want = run_all(reqs, plain, 12, &a, &fa);  // 12 blocks of 16 for 4 x 35 positions
  SchedulerOptions spec = plain;
  spec.speculative.method = SpeculativeMethod::Ngram;
  const auto got = run_all(reqs, spec, 12, &b, &fb);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_EQ(a.preempted, 0);
  EXPECT_EQ(b.preempted, 0) << "drafts preempted a request";
  EXPECT_GT(b.verify_rows, 0);
  EXPECT_EQ(fa, 12);
  EXPECT_EQ(fb, 12);
}

// The engine counts verify rows, drafts and kept drafts, and /metrics shows them.
TEST(Speculative, EngineCountsAndMetricsShowThem) {
  EngineOptions eo;
  eo.scheduler.speculative.method = SpeculativeMethod::Ngram;
  Engine engine(test::tiny().backend(64), eo);
  std::mutex mu;
  std::vector<int32_t> got;
  GenerationRequest r;
  for (int k = 0; k < 8; ++k) r.prompt.insert(r.prompt.end(), {5, 6, 7});
  r.max_tokens = 30;
  r.ignore_eos = true;
  engine.submit(r, [&](const RequestEvent& e) {
    std::lock_guard lk(mu);
    got.insert(got.end(), e.new_tokens.begin(), e.new_tokens.end());
  });
  ASSERT_TRUE(engine.wait_idle(std::chrono::seconds(60)));
  const EngineStats st = engine.stats();
  EXPECT_EQ(got.size(), 30u);
  EXPECT_GT(st.spec_verify_rows, 0u);
  EXPECT_GE(st.spec_draft_tokens, st.spec_verify_rows);
  EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(st.generation_tokens, 30u);
  const std::string m = serve::render_metrics(st, serve::ServerCounters{});
  for (const char* name : {"m3_spec_verify_rows_total", "m3_spec_draft_tokens_total", "m3_spec_accepted_tokens_total"})
    EXPECT_NE(m.find(std::string(name) + " "), std::string::npos) << name << " missing from /metrics";
  EXPECT_NE(m.find("m3_spec_verify_rows_total " + serve::format_value(double(st.spec_verify_rows))), std::string::npos);
}

// Sampled requests decode one token a step even with speculation on (their draws, and so their
// tokens, must not depend on the batch): the same tokens as without it, and no verify row.
TEST(Speculative, SampledRequestsDoNotSpeculateInTheScheduler) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 6; ++k) r.prompt.insert(r.prompt.end(), {int32_t(40 + i), 41, 42, 43});
    r.max_tokens = 16;
    r.ignore_eos = true;
    r.sampling.temperature = 0.7f;
    r.sampling.seed = 100 + uint64_t(i);
    reqs.push_back(std::move(r));
  }
  SchedulerOptions plain;
  StepReport a, b;
  int fa = 0, fb = 0;
  const auto want = run_all(reqs, plain, 32, &a, &fa);
  SchedulerOptions spec = plain;
  spec.speculative.method = SpeculativeMethod::Ngram;
  const auto got = run_all(reqs, spec, 32, &b, &fb);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_EQ(b.verify_rows, 0);
  EXPECT_EQ(fb, 32);
}
