// Sampling on the backend (SeqStep::sample -> StepOutput::tokens) on the CPU: the reference
// backend's tokens equal sample_token on its own returned logits for random parameters; the exact
// host implementation it uses equals sample_token on crafted rows with ties and -inf entries; the
// scheduler / engine give the same tokens with device_sampling on and off (greedy and seeded, several
// concurrent requests, a backend that ignores the requests falls back to host sampling); bad
// requests throw naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "common/tiny_reference.h"
#include "common/random.h"
#include "model/synthetic.h"
#include "ref/engine.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/step_sampling.h"

using namespace m3;

namespace {

using test::tiny;

SamplingParams random_params(std::mt19937_64& rng, int vocab) {
  SamplingParams p;
  switch (rng() % 6) {
    case 0: break;                                              // greedy
    case 1: p.temperature = 0.3f + float(rng() % 100) / 50; break;  // temperature only
    case 2: p.temperature = 1.0f, p.top_k = 1 + int(rng() % 40); break;
    case 3: p.temperature = 0.7f, p.top_p = 0.05f + float(rng() % 90) / 100; break;
    case 4:
      p.temperature = 0.5f + float(rng() % 100) / 100;
      p.top_k = 1 + int(rng() % uint64_t(vocab + 5));  // also beyond the vocabulary
      p.top_p = 0.1f + float(rng() % 90) / 100;
      break;
    default: p.temperature = 1e-3f, p.top_k = 3; break;          // nearly greedy
  }
  p.seed = rng();
  return p;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int n, int vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t(rng() % uint64_t(vocab)));
  return v;
}

}  // namespace

TEST(StepSampling, RefBackendTokensEqualSampleTokenOnItsLogits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int V = tiny().spec.vocab_size;
  auto be = tiny().backend(32);
  // 3 sequences: prefill (logits of the last row), prefill with all_logits, then decode steps;
  // one sequence never asks (its token stays -1).
  const int bs = be->cache_block_size();
  std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  std::vector<int32_t> pos(3, 0);
  std::vector<std::vector<int32_t>> next = {random_prompt(rng, 5, V), random_prompt(rng, 17, V), random_prompt(rng, 2, V)};
  int checked = 0;
  for (int step = 0; step < 6; ++step) {
    StepBatch b;
    std::vector<SamplingParams> ps;
    for (int k = 0; k < 3; ++k) {
      SeqStep q{pos[size_t(k)], next[size_t(k)], tables[size_t(k)], step == 0 && k == 1};
      ASSERT_LE(pos[size_t(k)] + int(q.tokens.size()), 4 * bs);
      SamplingParams p = random_params(rng, V);
      ps.push_back(p);
      if (k != 2) q.sample = SamplingRequest{p, SamplerState{p.seed, rng() % 1000}};
      q.want_logits = (step % 2) == 0;
      b.seqs.push_back(std::move(q));
    }
    StepOutput out = be->step(b);
    ASSERT_EQ(out.tokens.size(), 3u);
    EXPECT_EQ(out.tokens[2], -1);
    for (int k = 0; k < 2; ++k) {
      SamplerState st = b.seqs[size_t(k)].sample->state;
      const int want = sample_token(out.row(k, out.num_rows[size_t(k)] - 1), V, ps[size_t(k)], st);
      EXPECT_EQ(out.tokens[size_t(k)], want) << "step " << step << " seq " << k << " T " << ps[size_t(k)].temperature
                                            << " top_k " << ps[size_t(k)].top_k << " top_p " << ps[size_t(k)].top_p;
      ++checked;
    }
    for (int k = 0; k < 3; ++k) {
      pos[size_t(k)] += int(b.seqs[size_t(k)].tokens.size());
      next[size_t(k)] = {k < 2 ? out.tokens[size_t(k)] : int32_t(rng() % uint64_t(V))};
    }
  }
  EXPECT_EQ(checked, 12);
  // no request at all: no tokens
  StepOutput none = be->step(StepBatch{{SeqStep{pos[0], next[0], tables[0], false}}});
  EXPECT_TRUE(none.tokens.empty());
}

TEST(StepSampling, HostImplementationOnTiesAndNegInfRows) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int V = 1 + int(rng() % 300);
    const int rows = 1 + int(rng() % 4);
    StepOutput out;
    out.vocab = V;
    out.logits.resize(size_t(rows) * size_t(V));
    for (auto& x : out.logits) {
      const uint64_t r = rng() % 10;
      x = r == 0 ? -INFINITY : r < 4 ? float(int(rng() % 5)) : float(std::normal_distribution<double>(0, 2)(rng));
    }
    for (int k = 0; k < rows; ++k) out.logits[size_t(k) * size_t(V) + rng() % uint64_t(V)] = 1.5f;  // one finite
    if (trial % 7 == 0) out.logits[rng() % out.logits.size()] = INFINITY;
    if (trial % 11 == 0) out.logits[rng() % out.logits.size()] = -0.0f;
    StepBatch b;
    for (int k = 0; k < rows; ++k) {
      out.first_row.push_back(k);
      out.num_rows.push_back(1);
      SeqStep q;
      q.tokens = {0};
      SamplingParams p = random_params(rng, V);
      q.sample = SamplingRequest{p, SamplerState{rng(), rng() % 100}};
      b.seqs.push_back(std::move(q));
    }
    // a row of only -inf: greedy gives 0 as argmax_token, stochastic is an error naming the sequence
    bool all_ninf = trial % 13 == 0;
    if (all_ninf) std::fill(out.logits.begin(), out.logits.begin() + V, -INFINITY);
    if (all_ninf && b.seqs[0].sample->params.temperature > 0) {
      EXPECT_THROW(
          {
            try {
              sample_step_on_host(b, out);
            } catch (const std::exception& e) {
              EXPECT_NE(std::string(e.what()).find("seqs[0]"), std::string::npos) << e.what();
              EXPECT_NE(std::string(e.what()).find("-inf"), std::string::npos) << e.what();
              throw;
            }
          },
          std::exception);
      continue;
    }
    sample_step_on_host(b, out);
    for (int k = 0; k < rows; ++k) {
      SamplerState st = b.seqs[size_t(k)].sample->state;
      EXPECT_EQ(out.tokens[size_t(k)], sample_token(out.row(k), V, b.seqs[size_t(k)].sample->params, st))
          << "trial " << trial << " row " << k;
    }
  }
  // NaN: error naming the sequence and the token
  StepOutput out;
  out.vocab = 4;
  out.logits = {0, 1, NAN, 2};
  out.first_row = {0};
  out.num_rows = {1};
  StepBatch b;
  b.seqs.resize(1);
  b.seqs[0].sample = SamplingRequest{};
  try {
    sample_step_on_host(b, out);
    ADD_FAILURE() << "NaN row did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("seqs[0]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token 2 is NaN"), std::string::npos) << e.what();
  }
}

TEST(StepSampling, BadRequestsThrowNamingTheField) {
  auto be = tiny().backend(8);
  auto expect_throw = [&](SamplingParams p, const std::string& field) {
    StepBatch b;
    b.seqs.push_back(SeqStep{0, {1, 2}, {0}, false});
    b.seqs.push_back(SeqStep{0, {3}, {1}, false});
    b.seqs[1].sample = SamplingRequest{p, {}};
    try {
      be->step(b);
      ADD_FAILURE() << field << ": no error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("seqs[1].sample." + field), std::string::npos) << e.what();
    }
  };
  expect_throw(SamplingParams{-1.0f, 0, 1.0f, 0}, "temperature");
  expect_throw(SamplingParams{NAN, 0, 1.0f, 0}, "temperature");
  expect_throw(SamplingParams{1.0f, -2, 1.0f, 0}, "top_k");
  expect_throw(SamplingParams{1.0f, 0, 0.0f, 0}, "top_p");
  expect_throw(SamplingParams{1.0f, 0, 1.5f, 0}, "top_p");
}

namespace {

struct Out {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  std::string error;
};

std::vector<GenerationRequest> mixed_requests(std::mt19937_64& rng, int n) {
  std::vector<GenerationRequest> v;
  const int V = tiny().spec.vocab_size;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt = random_prompt(rng, 1 + int(rng() % 60), V);
    r.max_tokens = 3 + int(rng() % 6);
    r.ignore_eos = true;
    if (i % 2 == 1) r.sampling = random_params(rng, V);
    if (i % 4 == 1) r.sampling.temperature = 1.0f, r.sampling.top_k = 0, r.sampling.top_p = 1.0f;
    v.push_back(std::move(r));
  }
  return v;
}

std::map<uint64_t, Out> run_engine(const std::vector<GenerationRequest>& reqs, bool device_sampling,
                                   std::unique_ptr<Backend> be) {
  EngineOptions eo;
  eo.scheduler = SchedulerOptions{4, 32, 0};  // chunked prefill shares steps with decodes
  eo.scheduler.device_sampling = device_sampling;
  Engine e(std::move(be), eo);
  std::mutex mu;
  std::map<uint64_t, Out> res;
  for (size_t i = 0; i < reqs.size(); ++i)
    e.submit(reqs[i], [&res, &mu, i](const RequestEvent& ev) {
      std::lock_guard lk(mu);
      Out& o = res[i];
      o.tokens.insert(o.tokens.end(), ev.new_tokens.begin(), ev.new_tokens.end());
      if (ev.finished) o.reason = ev.reason, o.error = ev.error;
    });
  EXPECT_TRUE(e.wait_idle(std::chrono::seconds(120)));
  e.shutdown(std::chrono::milliseconds(0));
  return res;
}

// Forwards to the reference but drops the sampling requests (a backend that does not sample).
class NoSampling : public Backend {
 public:
  explicit NoSampling(std::unique_ptr<Backend> b) : b_(std::move(b)) {}
  std::string name() const override { return "no-sampling"; }
  const ModelSpec& spec() const override { return b_->spec(); }
  int cache_block_size() const override { return b_->cache_block_size(); }
  int num_cache_blocks() const override { return b_->num_cache_blocks(); }
  StepOutput step(const StepBatch& batch, SelectionTrace* trace) override {
    StepBatch c = batch;
    for (auto& s : c.seqs) s.sample.reset();
    return b_->step(c, trace);
  }

 private:
  std::unique_ptr<Backend> b_;
};

}  // namespace

TEST(StepSampling, EngineSameTokensWithAndWithoutDeviceSampling) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto reqs = mixed_requests(rng, 8);
  auto host = run_engine(reqs, false, tiny().backend(64));
  auto dev = run_engine(reqs, true, tiny().backend(64));
  auto fallback = run_engine(reqs, true, std::make_unique<NoSampling>(tiny().backend(64)));
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + " T " + std::to_string(reqs[i].sampling.temperature));
    EXPECT_EQ(host[i].reason, FinishReason::Length) << host[i].error;
    EXPECT_EQ(int(host[i].tokens.size()), reqs[i].max_tokens);
    EXPECT_EQ(dev[i].reason, FinishReason::Length) << dev[i].error;
    EXPECT_EQ(dev[i].tokens, host[i].tokens);
    EXPECT_EQ(fallback[i].tokens, host[i].tokens);
  }
}
