// The tensor-parallel collectives and agreement protocol (runtime/communicator.h) on the in-process
// group (ranks as threads): sums in rank order and bitwise the same on every rank; broadcast and
// gather; one refusing rank turns every rank down with every rank's reasons; a rank acting on
// another step shape, or calling another collective, is an error on every rank (not a hang); a rank
// that leaves or hangs makes the others fail promptly, naming it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/check.h"
#include "runtime/communicator.h"

using namespace m3;
using namespace std::chrono_literals;

namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// Runs body(rank, comm) on `n` threads; returns each rank's error message ("" when it returned).
std::vector<std::string> run_ranks(LocalGroup& g, const std::function<void(int, Communicator&)>& body) {
  const int n = g.size();
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(g.rank(r));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        body(r, *comms[size_t(r)]);
      } catch (const Error& e) {
        err[size_t(r)] = e.what();
        if (err[size_t(r)].empty()) err[size_t(r)] = "(empty message)";
      }
    });
  for (auto& t : th) t.join();
  return err;
}

bool has(const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; }

}  // namespace

TEST(Communicator, AllReduceAddsInRankOrderAndEveryRankGetsTheSameBits) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int n : {1, 2, 3, 4}) {
    LocalGroup g(n);
    const size_t len = 1000;
    std::vector<std::vector<float>> in(static_cast<size_t>(n), std::vector<float>(len));
    std::mt19937_64 rng(seed + uint64_t(n));
    // magnitudes spread over many binades, so another summation order would round differently
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : in)
      for (auto& x : v) x = std::ldexp(u(rng), int(rng() % 40) - 20);
    std::vector<float> want(len);
    for (size_t i = 0; i < len; ++i) {
      float acc = in[0][i];
      for (int r = 1; r < n; ++r) acc = acc + in[size_t(r)][i];
      want[i] = acc;
    }
    std::vector<std::vector<float>> out(static_cast<size_t>(n));
    const auto err = run_ranks(g, [&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.size(), n);
      const std::vector<float>& v = in[size_t(r)];
      // several collectives in a row, so the group's phases turn over
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> w = v;  // in place: the rank's values in, the sums out
        c.all_reduce_sum(w.data(), len);
        if (rep == 19) out[size_t(r)] = w;
      }
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(err[size_t(r)], "") << "rank " << r;
      ASSERT_EQ(out[size_t(r)].size(), len);
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < len; ++i)
        if (std::memcmp(&out[size_t(r)][i], &want[i], 4) != 0 && bad++ == 0) first = i;
      EXPECT_EQ(bad, 0u) << "n " << n << " rank " << r << ": " << bad << " sums differ from rank order, first [" << first
                         << "] " << out[size_t(r)][first] << " vs " << want[first];
    }
  }
}

TEST(Communicator, BroadcastAndGather) {
  LocalGroup g(4);
  std::vector<std::vector<int>> got(4), gathered(4);
  const auto err = run_ranks(g, [&](int r, Communicator& c) {
    std::vector<int> v(5, -1);
    if (r == 2) v = {7, 8, 9, 10, 11};
    c.broadcast(v.data(), v.size() * sizeof(int), 2);
    got[size_t(r)] = v;
    int mine = 100 + r;
    std::vector<int> all(4, -1);
    c.all_gather(&mine, all.data(), sizeof mine);
    gathered[size_t(r)] = all;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(err[size_t(r)], "");
    EXPECT_EQ(got[size_t(r)], (std::vector<int>{7, 8, 9, 10, 11})) << "rank " << r;
    EXPECT_EQ(gathered[size_t(r)], (std::vector<int>{100, 101, 102, 103})) << "rank " << r;
  }
}

TEST(Communicator, OneRefusingRankTurnsEveryRankDownWithEveryReason) {
  LocalGroup g(4);
  std::vector<Agreement> seen(4);
  auto err = run_ranks(g, [&](int r, Communicator& c) {
    Verdict v;
    if (r == 2) v = {false, "mono: 3 CTAs co-resident, 132 needed"};
    if (r == 3) v = {false, "mono: layer 5 router is BF16"};
    seen[size_t(r)] = agree(c, v);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(err[size_t(r)], "");
    EXPECT_FALSE(seen[size_t(r)].ok) << "rank " << r << " went ahead alone";
    EXPECT_EQ(seen[size_t(r)].refusals(),
              "rank 2: mono: 3 CTAs co-resident, 132 needed; rank 3: mono: layer 5 router is BF16");
    ASSERT_EQ(seen[size_t(r)].ranks.size(), 4u);
    EXPECT_TRUE(seen[size_t(r)].ranks[0].ok);
  }
  err = run_ranks(*std::make_unique<LocalGroup>(3), [&](int r, Communicator& c) {
    const Agreement a = agree(c, Verdict{true, r == 1 ? "ok, with a note" : ""});
    EXPECT_TRUE(a.ok);
    EXPECT_EQ(a.refusals(), "");
    EXPECT_EQ(a.ranks[1].reason, "ok, with a note");
  });
  for (const auto& e : err) EXPECT_EQ(e, "");
}

TEST(Communicator, AStepShapeThatDiffersIsAnErrorOnEveryRank) {
  LocalGroup g(4);
  auto err = run_ranks(g, [&](int r, Communicator& c) {
    int shape[3] = {4, 1, 8192};
    if (r == 3) shape[2] = 8193;
    check_same(c, shape, sizeof shape, "step shape");
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(has(err[size_t(r)], "step shape") && has(err[size_t(r)], "rank 3") && !has(err[size_t(r)], "rank 1"))
        << "rank " << r << ": " << err[size_t(r)];
  // different lengths are named too; equal bytes pass
  LocalGroup g2(3);
  err = run_ranks(g2, [&](int r, Communicator& c) {
    std::vector<int> shape(r == 1 ? 4 : 3, 1);
    check_same(c, shape.data(), shape.size() * sizeof(int), "step shape");
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(has(err[size_t(r)], "rank 1 (16 bytes against 12)")) << "rank " << r << ": " << err[size_t(r)];
  LocalGroup g3(3);
  err = run_ranks(g3, [&](int, Communicator& c) {
    const char s[] = "decode b=4 mono";
    check_same(c, s, sizeof s, "step");
  });
  for (const auto& e : err) EXPECT_EQ(e, "");
}

TEST(Communicator, DifferentCollectivesFailOnEveryRankAndTheGroupGoesOn) {
  LocalGroup g(3);
  std::vector<float> after(3, 0.f);
  const auto err = run_ranks(g, [&](int r, Communicator& c) {
    std::vector<float> v(8, 1.f);
    try {
      if (r == 1) c.broadcast(v.data(), 32, 0);
      else c.all_reduce_sum(v.data(), 8);
      ADD_FAILURE() << "rank " << r << ": a mismatched collective passed";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(has(m, "rank 0 called 'all_reduce_sum of 8 floats'") &&
                  has(m, "rank 1 called 'broadcast of 32 bytes from rank 0'"))
          << "rank " << r << ": " << m;
    }
    float x = float(r + 1);
    c.all_reduce_sum(&x, 1);  // the group still works
    after[size_t(r)] = x;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(err[size_t(r)], "");
    EXPECT_EQ(after[size_t(r)], 6.f);
  }
}

TEST(Communicator, ALeavingRankFailsTheOthersPromptlyNamingIt) {
  LocalGroup g(4, 5000ms);
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = run_ranks(g, [&](int r, Communicator& c) {
    float x = 1.f;
    c.all_reduce_sum(&x, 1);
    if (r == 2) {
      c.fail("killed mid-step");
      return;
    }
    c.all_reduce_sum(&x, 1);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.0) << "the others waited for the group timeout instead of failing at once";
  for (int r : {0, 1, 3})
    EXPECT_TRUE(has(err[size_t(r)], "rank 2 left the group: killed mid-step")) << "rank " << r << ": " << err[size_t(r)];
  EXPECT_EQ(err[2], "");
  // later collectives fail at once too
  auto c0 = LocalGroup(2, 5000ms);
  auto a = c0.rank(0);
  { auto b = c0.rank(1); }  // rank 1's communicator destroyed: it left
  float y = 0;
  try {
    a->all_reduce_sum(&y, 1);
    ADD_FAILURE() << "a collective without rank 1 passed";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "rank 1 left the group: its communicator was destroyed")) << e.what();
  }
}

TEST(Communicator, AHangingRankTimesTheOthersOutNamingIt) {
  LocalGroup g(4, 300ms);
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = run_ranks(g, [&](int r, Communicator& c) {
    if (r == 3) {
      std::this_thread::sleep_for(1500ms);  // hangs past the timeout, then arrives at a broken group
    }
    float x = 1.f;
    c.all_reduce_sum(&x, 1);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 3.0);
  for (int r : {0, 1, 2})
    EXPECT_TRUE(has(err[size_t(r)], "rank(s) 3 did not arrive") && has(err[size_t(r)], "300 ms"))
        << "rank " << r << ": " << err[size_t(r)];
  EXPECT_TRUE(has(err[3], "did not arrive")) << err[3];  // the late rank learns why the group broke
}

TEST(Communicator, HelpersOfDifferentKindsDoNotReadEachOthersBytes) {
  LocalGroup g(2);
  auto err = run_ranks(g, [&](int r, Communicator& c) {
    if (r == 0) agree(c, Verdict{true, ""});
    else check_same(c, "1", 1, "step");
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(has(err[size_t(r)], "rank 0 is in 'agree:'") && has(err[size_t(r)], "rank 1 is in 'check_same:step'"))
        << "rank " << r << ": " << err[size_t(r)];
  LocalGroup g2(2);
  err = run_ranks(g2, [&](int r, Communicator& c) {
    const int v = 5;
    check_same(c, &v, sizeof v, r == 0 ? "step shape" : "mono decision");
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(has(err[size_t(r)], "mono decision")) << err[size_t(r)];
  // a bad broadcast root fails every rank at once (not a timeout)
  LocalGroup g3(3, 5000ms);
  const auto t0 = std::chrono::steady_clock::now();
  err = run_ranks(g3, [&](int, Communicator& c) {
    float x = 0;
    c.broadcast(&x, 4, 7);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  for (const auto& e : err) EXPECT_TRUE(has(e, "root 7")) << e;
}

TEST(Communicator, BadGroupsAreRefused) {
  EXPECT_THROW(LocalGroup(0), Error);
  EXPECT_THROW(LocalGroup(2, std::chrono::milliseconds::max()), Error);
  LocalGroup g(2);
  auto a = g.rank(0);
  EXPECT_THROW(g.rank(0), Error);
  EXPECT_THROW(g.rank(2), Error);
}
