// Rank 0 leads, the others follow (runtime/tp_leader.h), over the in-process group:
//  - a step's message round-trips every field of a random batch; truncated, foreign or padded
//    messages are refused naming what is wrong;
//  - the CPU reference at TP 2 with rank 1 following rank 0 gives, step for step, the bits of the
//    threaded TP 2 backend (the same rank-order sums), traces included; a malformed step fails on
//    the leader and the group goes on; an idle leader's heartbeats keep the follower inside the
//    group's timeout; closing the leader ends the follower, which ran every step it was sent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "common/compare.h"
#include "model/synthetic.h"
#include "ref/engine.h"
#include "runtime/communicator.h"
#include "runtime/tp_leader.h"

using namespace m3;

namespace {

StepBatch random_batch(std::mt19937& rng) {
  StepBatch b;
  const int n = 1 + int(rng() % 5);
  for (int i = 0; i < n; ++i) {
    SeqStep s;
    s.start_pos = int32_t(rng() % 5000);
    const int k = 1 + int(rng() % 9);
    for (int j = 0; j < k; ++j) s.tokens.push_back(int32_t(rng()));
    const int blocks = int(rng() % 7);
    for (int j = 0; j < blocks; ++j) s.block_table.push_back(int32_t(rng() % 1000) - 1);
    s.all_logits = rng() & 1;
    s.want_logits = rng() & 1;
    s.want_aux = rng() & 1;
    if (rng() & 1) {
      SamplingRequest q;
      q.params.temperature = float(rng() % 1000) / 997.f;
      q.params.top_k = int(rng() % 50);
      q.params.top_p = float(rng() % 1000) / 1000.f;
      q.params.seed = (uint64_t(rng()) << 32) | rng();
      q.state.seed = (uint64_t(rng()) << 32) | rng();
      q.state.draws = rng();
      s.sample = q;
    }
    b.seqs.push_back(s);
  }
  for (int l = 0; l < int(rng() % 4); ++l) b.aux_layers.push_back(int(rng() % 60));
  return b;
}

void expect_same_batch(const StepBatch& a, const StepBatch& b) {
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    const SeqStep &x = a.seqs[i], &y = b.seqs[i];
    EXPECT_EQ(x.start_pos, y.start_pos);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.block_table, y.block_table);
    EXPECT_EQ(x.all_logits, y.all_logits);
    EXPECT_EQ(x.want_logits, y.want_logits);
    EXPECT_EQ(x.want_aux, y.want_aux);
    ASSERT_EQ(x.sample.has_value(), y.sample.has_value());
    if (x.sample) {
      EXPECT_EQ(std::memcmp(&x.sample->params.temperature, &y.sample->params.temperature, 4), 0);
      EXPECT_EQ(x.sample->params.top_k, y.sample->params.top_k);
      EXPECT_EQ(std::memcmp(&x.sample->params.top_p, &y.sample->params.top_p, 4), 0);
      EXPECT_EQ(x.sample->params.seed, y.sample->params.seed);
      EXPECT_EQ(x.sample->state.seed, y.sample->state.seed);
      EXPECT_EQ(x.sample->state.draws, y.sample->state.draws);
    }
  }
  EXPECT_EQ(a.aux_layers, b.aux_layers);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TpLeader, StepMessagesRoundTripAndBadOnesAreRefused) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int it = 0; it < 200; ++it) {
    const StepBatch b = random_batch(rng);
    const std::vector<uint8_t> m = encode_step(b);
    expect_same_batch(b, decode_step(m.data(), m.size()));
    if (HasFailure()) return;
    // every truncation is refused (never read past the end, never accepted)
    const size_t cut = size_t(rng() % m.size());
    EXPECT_NE(error_of([&] { decode_step(m.data(), cut); }).find("tp step message"), std::string::npos) << cut;
  }
  std::vector<uint8_t> m = encode_step(random_batch(rng));
  m.push_back(0);
  EXPECT_NE(error_of([&] { decode_step(m.data(), m.size()); }).find("1 bytes left over"), std::string::npos);
  m.pop_back();
  m[0] ^= 0xff;
  EXPECT_NE(error_of([&] { decode_step(m.data(), m.size()); }).find("not a step"), std::string::npos);
}

TEST(TpLeader, FollowerRunsRankZerosStepsBitwiseTheThreadedRanks) {
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  const ModelWeights w = synthetic_weights(spec, so);
  std::mt19937 rng(so.seed);
  const int prompt = 40 + int(rng() % 40), decode = 5, blocks = (prompt + decode) / spec.index_block + 2;

  ref::RefOptions threaded{blocks, 2};
  threaded.tp = 2;
  auto expect_be = ref::make_ref_backend(spec, w, threaded);

  // the group's timeout is short so that the idle stretch below outlasts it several times: only the
  // leader's heartbeats keep the follower's wait alive
  LocalGroup group(2, std::chrono::milliseconds(400));
  std::shared_ptr<Communicator> c0 = group.rank(0), c1 = group.rank(1);
  auto rank_opts = [&](std::shared_ptr<Communicator> c) {
    ref::RefOptions o{blocks, 1};
    o.tp = 2;
    o.comm = std::move(c);
    return o;
  };
  auto follower = std::async(std::launch::async, [&]() -> int64_t {
    auto be = ref::make_ref_backend(spec, w, rank_opts(c1));
    return follow_tp_leader(*be, *c1);
  });
  LeaderOptions lo;
  lo.heartbeat = std::chrono::milliseconds(100);
  auto leader = make_tp_leader(ref::make_ref_backend(spec, w, rank_opts(c0)), c0, lo);
  EXPECT_EQ(leader->spec().num_layers, spec.num_layers);

  auto seq = [&](std::vector<int32_t> toks, int start) {
    StepBatch b;
    SeqStep s;
    s.start_pos = start;
    s.tokens = std::move(toks);
    for (int i = 0; i < blocks; ++i) s.block_table.push_back(i);
    b.seqs.push_back(s);
    return b;
  };
  std::vector<int32_t> toks(static_cast<size_t>(prompt));
  for (auto& t : toks) t = int32_t(rng() % uint32_t(spec.vocab_size));
  int64_t sent = 0;
  auto both = [&](const StepBatch& b, bool traced) {
    SelectionTrace tl, te;
    StepOutput got = leader->step(b, traced ? &tl : nullptr);
    ++sent;
    StepOutput want = expect_be->step(b, traced ? &te : nullptr);
    if (got.vocab != want.vocab || got.logits.size() != want.logits.size()) {
      ADD_FAILURE() << "leader: " << got.logits.size() << " logits of vocab " << got.vocab << ", threaded ranks: "
                    << want.logits.size() << " of " << want.vocab;
      return int32_t(0);
    }
    EXPECT_CLOSE(got.logits, want.logits, 0.0, 0.0);  // bitwise: the same sums in the same order
    if (traced) {
      EXPECT_EQ(tl.blocks, te.blocks);
      EXPECT_EQ(tl.experts, te.experts);
    }
    return int32_t(std::max_element(want.logits.end() - spec.vocab_size, want.logits.end()) -
                   (want.logits.end() - spec.vocab_size));
  };
  int32_t next = both(seq(toks, 0), true);
  int pos = prompt;
  for (int i = 0; i < decode; ++i) {
    if (i == 2) {
      // a malformed step (its block table misses the positions it writes): refused on the leader,
      // alike on the follower, and the group goes on
      StepBatch bad = seq({next}, pos);
      bad.seqs[0].block_table.resize(0);
      EXPECT_FALSE(error_of([&] { leader->step(bad); }).empty());
      ++sent;
      // idle for 3x the group's timeout: the heartbeats keep the follower waiting without error
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    }
    next = both(seq({next}, pos), i % 2 == 1);
    ++pos;
  }
  leader.reset();  // stop
  ASSERT_EQ(follower.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(follower.get(), sent);
}

TEST(TpLeader, OnlyRankZeroLeadsAndOnlyOthersFollow) {
  LocalGroup group(2);
  std::shared_ptr<Communicator> c0 = group.rank(0), c1 = group.rank(1);
  ModelSpec spec = synthetic_preset("tiny");
  auto be = ref::make_ref_backend(spec, synthetic_weights(spec, SyntheticOptions{}), ref::RefOptions{4, 1});
  EXPECT_NE(error_of([&] { make_tp_leader(nullptr, c1); }).find("no backend"), std::string::npos);
  EXPECT_NE(error_of([&] { follow_tp_leader(*be, *c0); }).find("rank 0 leads"), std::string::npos);
}
