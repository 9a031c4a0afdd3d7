// The host side of mono (src/mono, no GPU): the lifecycle state machine transition by transition,
// the per-step rules, the static refusals with their reasons, the op codes of plan ops, and the task
// tables: every item of every op assigned once, per-CTA lists in the global order, and a simulated
// execution (random interleavings of the CTAs under the kernel's counter rule) that never deadlocks
// and never starts a task before everything it depends on completed.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <set>
#include <tuple>

#include "core/check.h"
#include "model/synthetic.h"
#include "mono/eligibility.h"
#include "mono/lifecycle.h"
#include "mono/mono.h"
#include "mono/op_code.h"
#include "mono/options.h"
#include "mono/task_table.h"

using namespace m3;
using namespace m3::mono;

namespace {

uint64_t fresh_seed() { return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}(); }

StepBatch decode_batch(int rows, int q = 1) {
  StepBatch b;
  for (int i = 0; i < rows; ++i) b.seqs.push_back(SeqStep{10, std::vector<int32_t>(size_t(q), 1), {0}, false});
  return b;
}

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

// Runs table t to its end under the kernel's rule, the CTAs advancing in a random order: a CTA's
// next task starts once its op's waits (wait_op, wait_op2) are met. Before each task starts, every
// op of inputs(op) must have completed. Returns the tasks run; fewer than the table's is a deadlock.
int64_t simulate(const TaskTable& t, std::mt19937_64& rng, const std::function<std::vector<int>(int)>& inputs) {
  std::vector<int64_t> done(t.ops.size(), 0);
  std::vector<int32_t> at(static_cast<size_t>(t.grid));
  for (int c = 0; c < t.grid; ++c) at[size_t(c)] = t.cta_begin[size_t(c)];
  auto met = [&](int w) { return w < 0 || done[size_t(w)] == t.ops[size_t(w)].items; };
  int64_t ran = 0;
  for (;;) {
    std::vector<int> ready;
    for (int c = 0; c < t.grid; ++c) {
      if (at[size_t(c)] == t.cta_begin[size_t(c + 1)]) continue;
      const MonoOp& o = t.ops[size_t(t.tasks[size_t(at[size_t(c)])].op)];
      if (met(o.wait_op) && met(o.wait_op2)) ready.push_back(c);
    }
    if (ready.empty()) break;
    const int c = ready[rng() % ready.size()];
    const MonoTask k = t.tasks[size_t(at[size_t(c)]++)];
    for (int j : inputs(k.op))
      if (!met(j)) {
        ADD_FAILURE() << "op " << k.op << " started before its input op " << j << " completed";
        return ran;
      }
    ++done[size_t(k.op)];
    ++ran;
  }
  return ran;
}

// A random op of a kind mono runs, with params whose shape gives `items` work items.
native::OpCall random_op(std::mt19937_64& rng, int layer) {
  native::OpCall c;
  c.layer = layer;
  c.stage = "test";
  switch (rng() % 4) {
    case 0: {
      kernels::RmsNormParams p;
      p.M = 1 + int(rng() % 4);
      p.n = 64;
      p.regs = int(rng() % 2);
      c.kind = native::OpKind::RmsNorm;
      c.name = "norm";
      c.params = p;
      break;
    }
    case 1: {
      kernels::MmaLinearParams p;
      p.N = 16 * (1 + int(rng() % 40));
      p.K = 64 * (1 + int(rng() % 8));
      p.M = 1 + int(rng() % 4);
      p.chains = 1 + int(rng() % 16);
      c.kind = native::OpKind::MmaLinear;
      c.name = "mma";
      c.params = p;
      break;
    }
    case 2: {
      kernels::MoeCombineParams p;
      p.H = 256 * (1 + int(rng() % 6));
      p.M = 1 + int(rng() % 4);
      c.kind = native::OpKind::MoeCombine;
      c.name = "combine";
      c.params = p;
      break;
    }
    default: {
      kernels::AttentionParams p;
      p.num_tokens = 1 + int(rng() % 4);
      p.kv_heads = 1;
      p.num_heads = 8;
      p.head_dim = 128;
      p.num_splits = 1 + int(rng() % 32);
      c.kind = native::OpKind::AttentionSplit;
      c.name = "attention";
      c.params = p;
      break;
    }
  }
  return c;
}

}  // namespace

TEST(MonoLifecycle, EveryTransition) {
  Lifecycle l;
  EXPECT_EQ(l.state(), State::Unbound);
  EXPECT_EQ(l.usable(), "unbound");
  EXPECT_THROW(l.ready(false), Error);  // no caches bound yet
  l.bind();
  EXPECT_EQ(l.state(), State::Bound);
  EXPECT_EQ(l.generation(), 1u);
  EXPECT_EQ(l.usable(), "");
  EXPECT_THROW(l.ready(true), Error);  // never built inside a graph capture
  EXPECT_EQ(l.state(), State::Bound);
  l.ready(false);
  EXPECT_EQ(l.state(), State::Ready);
  l.ready(false);  // another bucket's tables
  EXPECT_EQ(l.state(), State::Ready);
  l.fail("watchdog");
  EXPECT_EQ(l.state(), State::Broken);
  EXPECT_EQ(l.usable(), "broken");
  EXPECT_EQ(l.broken_reason(), "watchdog");
  EXPECT_THROW(l.ready(false), Error);
  l.bind();  // a new cache generation: usable again, no tables
  EXPECT_EQ(l.state(), State::Bound);
  EXPECT_EQ(l.generation(), 2u);
  EXPECT_EQ(l.broken_reason(), "");
  l.close();
  EXPECT_EQ(l.state(), State::Closed);
  EXPECT_EQ(l.usable(), "closed");
  l.close();  // idempotent
  EXPECT_EQ(l.state(), State::Closed);
  l.fail("late");  // a closed runtime stays closed
  EXPECT_EQ(l.state(), State::Closed);
  EXPECT_THROW(l.bind(), Error);
}

TEST(MonoEligibility, StepRules) {
  const StepRules r;  // the defaults: 4 rows of up to 4 tokens (decode and verify rows)
  for (int n = 1; n <= 4; ++n)
    for (int q = 1; q <= 4; ++q) EXPECT_EQ(step_refusal(decode_batch(n, q), r), "") << n << " x " << q;
  EXPECT_EQ(step_refusal(decode_batch(5), r), "batch_too_large");
  EXPECT_EQ(step_refusal(decode_batch(2, 5), r), "prefill");
  EXPECT_EQ(step_refusal(decode_batch(1), r, true), "traced");
  EXPECT_EQ(step_refusal(StepBatch{}, r), "empty");
  StepRules decode_only;
  decode_only.max_query_len = 1;
  EXPECT_EQ(step_refusal(decode_batch(2, 2), decode_only), "prefill");
  EXPECT_EQ(step_refusal(decode_batch(4, 1), decode_only), "");
  const StepRules verify;
  StepBatch uneven = decode_batch(2, 2);
  uneven.seqs[1].tokens.push_back(3);
  EXPECT_EQ(step_refusal(uneven, verify), "uneven_query");
  EXPECT_EQ(step_refusal(decode_batch(3, 4), verify), "");
  EXPECT_EQ(step_refusal(decode_batch(3, 5), verify), "prefill");
}

TEST(MonoEligibility, StaticRefusalsNameTheirCause) {
  const ModelSpec spec = synthetic_preset("real-heads");
  int first = spec.num_layers;
  while (first > 0 && spec.sparse(first - 1) && spec.moe(first - 1)) --first;
  ASSERT_LT(first, spec.num_layers);
  const PreparedLayout L = plan_prepared(spec);
  const CacheFormat ok{DType::F8_E4M3, DType::F8_E4M3, spec.index_block};
  EXPECT_TRUE(static_refusals(L, ok, first, spec.num_layers).empty());
  EXPECT_TRUE(static_refusals(L, CacheFormat{DType::BF16, DType::BF16, spec.index_block}, first, spec.num_layers).empty());
  auto r = static_refusals(L, CacheFormat{DType::F32, DType::F8_E4M3, spec.index_block}, first, spec.num_layers);
  EXPECT_TRUE(any_contains(r, "K/V cache dtype F32")) << (r.empty() ? "" : r[0]);
  r = static_refusals(L, CacheFormat{DType::F8_E4M3, DType::F8_E4M3, spec.index_block / 2}, first, spec.num_layers);
  EXPECT_TRUE(any_contains(r, "block size"));
  if (first > 0) {  // a dense layer in the range names itself
    r = static_refusals(L, ok, first - 1, spec.num_layers);
    EXPECT_TRUE(any_contains(r, fmt::format("layer {} layer: not a sparse MoE layer", first - 1))) << r[0];
  }
  EXPECT_FALSE(static_refusals(L, ok, spec.num_layers, spec.num_layers).empty());  // empty range
  PrepareOptions tp2;
  tp2.tp_size = 2;
  r = static_refusals(plan_prepared(spec, tp2), ok, first, spec.num_layers);
  EXPECT_TRUE(any_contains(r, "tensor parallelism: rank 0 of 2"));
  PrepareOptions mx;  // an MXFP8 release's projections: native only, and only that is said of them
  mx.mxfp8_projections = true;
  r = static_refusals(plan_prepared(spec, mx), ok, first, spec.num_layers);
  EXPECT_TRUE(any_contains(r, fmt::format("layer {} qkv: MXFP8", first)) &&
              any_contains(r, fmt::format("layer {} o_proj: MXFP8", first)))
      << (r.empty() ? "" : r[0]);
  EXPECT_EQ(r.size(), size_t(2 * (spec.num_layers - first))) << r[0];
  PreparedLayout bad = L;
  bad.layers[size_t(first)].router.dtype = DType::F8_E4M3;
  bad.layers[size_t(first)].shared_in_slot = false;
  r = static_refusals(bad, ok, first, spec.num_layers);
  EXPECT_TRUE(any_contains(r, fmt::format("layer {} router: F8_E4M3", first)));
  EXPECT_TRUE(any_contains(r, fmt::format("layer {} shared expert", first)));
}

TEST(MonoTaskTable, OpCodesAndRefusals) {
  native::OpCall e;
  e.kind = native::OpKind::Embed;
  e.name = "embed";
  e.params = kernels::EmbedParams{};
  std::string why;
  EXPECT_FALSE(op_code(e, &why).has_value());
  EXPECT_NE(why.find("embed"), std::string::npos) << why;
  native::OpCall m;
  m.kind = native::OpKind::MmaLinear;
  m.name = "qkv";
  kernels::MmaLinearParams mp;
  mp.N = 64;
  mp.K = 64;
  mp.M = 1;
  m.params = mp;
  EXPECT_EQ(op_code(m, &why), OpCode::MmaDecodeFp8F32);
  mp.stream = 1;  // the same tile, streamed
  m.params = mp;
  EXPECT_EQ(op_code(m, &why), OpCode::MmaStreamFp8F32);
  mp.stream = 0;
  mp.wfmt = kernels::WeightFmt::BF16;
  m.params = mp;
  EXPECT_FALSE(op_code(m, &why).has_value());
  EXPECT_NE(why.find("FP8"), std::string::npos) << why;
  mp.wfmt = kernels::WeightFmt::FP8;
  mp.deep = 1;
  m.params = mp;
  EXPECT_FALSE(op_code(m, &why).has_value());
  // verify steps of 9 .. 16 tokens: the 2 x 2 wide tile; other wide tilings are refused
  mp.deep = 0;
  mp.rt = mp.nt = 2;
  m.params = mp;
  EXPECT_EQ(op_code(m, &why), OpCode::MmaWide2x2Fp8F32);
  mp.rt = 4;
  mp.nt = 1;
  m.params = mp;
  EXPECT_FALSE(op_code(m, &why).has_value());
  EXPECT_NE(why.find("tiling 4 x 1"), std::string::npos) << why;
  // activations split by their producer (ActFmt::F32Split): the decode tile's register walk only
  mp.rt = mp.nt = 1;
  mp.deep = 0;
  mp.xfmt = kernels::ActFmt::F32Split;
  m.params = mp;
  EXPECT_EQ(op_code(m, &why), OpCode::MmaDecodeFp8Split);
  for (auto bad : {std::pair{2, 0}, std::pair{1, 1}}) {  // the 2 x 2 tile; streamed
    mp.rt = mp.nt = bad.first;
    mp.stream = bad.second;
    m.params = mp;
    EXPECT_FALSE(op_code(m, &why).has_value());
    EXPECT_NE(why.find("split activations"), std::string::npos) << why;
  }
  mp.rt = mp.nt = 1;
  mp.stream = 0;
  mp.xfmt = kernels::ActFmt::F32;
  mp.deep = 1;
  // the router GEMV: one row per item up to 4 tokens, two at 8 and 16; one pass of tokens only
  native::OpCall gv;
  gv.kind = native::OpKind::Gemv;
  gv.name = "router";
  kernels::GemvParams gp;
  gp.wfmt = kernels::WeightFmt::F32;
  gp.xfmt = kernels::ActFmt::F32;
  const std::tuple<kernels::WeightFmt, int, int, OpCode> gemvs[] = {
      {kernels::WeightFmt::F32, 1, 1, OpCode::GemvF32M1},    {kernels::WeightFmt::F32, 4, 1, OpCode::GemvF32M4},
      {kernels::WeightFmt::F32, 8, 2, OpCode::GemvF32M8},    {kernels::WeightFmt::F32, 16, 2, OpCode::GemvF32M16},
      {kernels::WeightFmt::BF16, 2, 1, OpCode::GemvBf16M2},  {kernels::WeightFmt::BF16, 8, 2, OpCode::GemvBf16M8},
      {kernels::WeightFmt::BF16, 16, 2, OpCode::GemvBf16M16}};
  for (const auto& [w, mt, rows, code] : gemvs) {
    gp.wfmt = w;
    gp.mt = gp.M = mt;
    gp.rows = rows;
    gv.params = gp;
    EXPECT_EQ(op_code(gv, &why), code) << mt << " tokens, " << rows << " rows: " << why;
  }
  for (const auto& [mt, rows, groups, what] :
       {std::tuple{4, 4, 1, "4 rows per item at 4 tokens"}, std::tuple{8, 1, 1, "1 rows per item at 8 tokens"},
        std::tuple{16, 4, 1, "4 rows per item at 16 tokens"}, std::tuple{16, 2, 2, "(16 per pass)"}}) {
    gp.mt = mt;
    gp.rows = rows;
    gp.token_groups = groups;
    gp.M = mt * groups;
    gv.params = gp;
    EXPECT_FALSE(op_code(gv, &why).has_value()) << what;
    EXPECT_NE(why.find(what), std::string::npos) << why;
  }
  gp.token_groups = 1;
  gp.mt = gp.M = gp.rows = 1;
  gp.wfmt = kernels::WeightFmt::FP8;
  gv.params = gp;
  EXPECT_FALSE(op_code(gv, &why).has_value());
  EXPECT_NE(why.find("FP8 weights"), std::string::npos) << why;
  // the indexer scores: one token per item only (the prefill's token tiles run other code)
  native::OpCall ix;
  ix.kind = native::OpKind::IndexerScores;
  ix.name = "indexer_scores";
  kernels::IndexerParams ip;
  ix.params = ip;
  EXPECT_EQ(op_code(ix, &why), OpCode::IndexerScoresFp8);
  ip.ik_fmt = kernels::CacheFmt::BF16;
  ix.params = ip;
  EXPECT_EQ(op_code(ix, &why), OpCode::IndexerScoresBf16);
  ip.tok_tile = kernels::kIndexerTokTile;
  ix.params = ip;
  EXPECT_FALSE(op_code(ix, &why).has_value());
  EXPECT_NE(why.find("tiles of 16 tokens"), std::string::npos) << why;
  for (int c = 0; c < int(OpCode::Count); ++c) EXPECT_STRNE(op_code_name(OpCode(c)), "?");
  // a table with an op mono does not run, and a group wider than the CTA, is refused with reasons
  std::vector<std::string> reasons;
  mp.deep = 0;
  mp.chains = 16;  // 512 threads
  m.params = mp;
  std::vector<native::OpCall> ops{m, e};
  TaskTable t = build_task_table(ops, 8, 256, 48 * 1024, &reasons);
  EXPECT_TRUE(t.ops.empty());
  EXPECT_TRUE(any_contains(reasons, "512 threads, the CTA has 256"));
  EXPECT_TRUE(any_contains(reasons, "embed"));
}

TEST(MonoTaskTable, EveryItemOnceInGlobalOrderAndASimulatedRunNeverDeadlocks) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<native::OpCall> ops;
    const int nops = 1 + int(rng() % 40);
    for (int i = 0; i < nops; ++i) ops.push_back(random_op(rng, i / 5));
    const int grid = 1 + int(rng() % 40);
    std::vector<std::string> why;
    const TaskTable t = build_task_table(ops, grid, 512, 96 * 1024, &why);
    ASSERT_TRUE(why.empty()) << why[0];  // (random ops: no MoE layer, so `early` changes nothing)
    ASSERT_EQ(check_task_order(t), "");
    int64_t total = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(t.ops[i].items, native::op_shape(ops[i]).items);
      // side-by-side groups fit the CTA's threads and shared memory
      EXPECT_GE(t.ops[i].groups, 1);
      EXPECT_LE(t.ops[i].groups * t.ops[i].threads, 512);
      EXPECT_LE(t.ops[i].groups * t.ops[i].smem, 96 * 1024);
      EXPECT_LE(t.ops[i].groups, kMaxGroups);
      EXPECT_EQ(t.ops[i].first_task, total);
      total += t.ops[i].items;
    }
    EXPECT_EQ(t.num_tasks(), total);
    // simulate: CTAs advance in random order; a task may start only when everything before it in
    // the plan has completed
    const int64_t ran = simulate(t, rng, [](int op) {
      std::vector<int> v(static_cast<size_t>(op));
      std::iota(v.begin(), v.end(), 0);
      return v;
    });
    ASSERT_EQ(ran, total) << "deadlock: " << ran << " of " << total << " tasks ran (grid " << grid << ")";
  }
  // a list out of the global order is caught
  std::vector<native::OpCall> ops;
  for (int i = 0; i < 6; ++i) ops.push_back(random_op(rng, 0));
  TaskTable t = build_task_table(ops, 2, 512, 96 * 1024, nullptr);
  ASSERT_GE(t.cta_begin[1] - t.cta_begin[0], 2);
  std::swap(t.tasks[0], t.tasks[1]);
  EXPECT_NE(check_task_order(t), "");
  t = build_task_table(ops, 2, 512, 96 * 1024, nullptr);
  t.ops[3].wait_op = 4;  // waits for a later op
  EXPECT_NE(check_task_order(t), "");
  t = build_task_table(ops, 2, 512, 96 * 1024, nullptr);
  t.ops[3].wait_items += 1;  // a wait target that is not the waited op's items (MonoOp::wait_items)
  EXPECT_NE(check_task_order(t), "");
  t = build_task_table(ops, 2, 512, 96 * 1024, nullptr);
  t.tasks.pop_back();
  t.cta_begin.back()--;
  EXPECT_NE(check_task_order(t), "");  // an item left out
}

// The trace summary (bench --trace): per op code its tasks, mean wait and run per task, summed
// spans and mean hops, from a hand-made trace whose figures are known (times in ns). Each op's
// items are listed out of order, so first starts and last ends are not the first / last records.
TEST(MonoTrace, SummaryGivesSpansAndHopsPerOpCode) {
  std::vector<TaskTrace> tr = {
      {1, 0, 3, "b", 1300, 2200, 3000},  // op 1 (b): span 2200..3000, hop 2200 - 1200
      {0, 1, 3, "a", 0, 200, 1200},      // op 0 (a): span 100..1200, first: no hop
      {0, 0, 3, "a", 0, 100, 1100},
      {2, 0, 4, "a", 3000, 3500, 4000},  // op 2 (a): span 3500..4000, hop 3500 - 3000
  };
  const std::string s = summarize_trace(tr);
  std::map<std::string, std::vector<double>> row;  // code -> ops tasks wait run span hop
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string code;
    l >> code;
    if (code != "a" && code != "b") continue;
    for (double v; l >> v;) row[code].push_back(v);
  }
  ASSERT_EQ(row["a"].size(), 6u) << s;
  ASSERT_EQ(row["b"].size(), 6u) << s;
  const std::vector<double> a = {2, 3, (100 + 200 + 500) / 3e3, (1000 + 1000 + 500) / 3e3, (1100 + 500) / 1e3, 0.5};
  const std::vector<double> b = {1, 1, 0.9, 0.8, 0.8, 1.0};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(row["a"][i], a[i], 0.006) << "column " << i << " of a in\n" << s;  // printed with 2 decimals (span: 1)
    EXPECT_NEAR(row["b"][i], b[i], 0.006) << "column " << i << " of b in\n" << s;
  }
  EXPECT_NE(s.find("launch 4.0 us"), std::string::npos) << s;
  EXPECT_NE(s.find("hops in all: 1.5 us over 2 ops"), std::string::npos) << s;
}

// Options from text (the bench's "mono:key=value/..." paths): every key sets its field, the rest
// keep their values, and a bad key or value is an error naming it.
TEST(MonoOptions, ParseNamesBadInput) {
  const MonoOptions d;
  const MonoOptions o =
      parse_options("poll_ns=256/pin=0/reserve=4/small=6/stage=3/smem_min=1000/smem_cap=4096/ring=1/early=0/fence=1/"
                    "grid=64/serialized=1/watchdog_ms=2.5");
  EXPECT_EQ(o.poll_ns, 256);
  EXPECT_FALSE(o.place.pin);
  EXPECT_EQ(d.place.stage, 0);
  EXPECT_EQ(o.place.stage, 3);
  EXPECT_EQ(o.smem_min, 1000);
  EXPECT_EQ(o.place.smem_cap, 4096);
  EXPECT_EQ(o.place.ring, 1);
  EXPECT_FALSE(o.place.early);
  EXPECT_TRUE(o.fence);
  EXPECT_EQ(d.place.ring, 0);
  EXPECT_TRUE(d.place.early);
  EXPECT_FALSE(d.fence);
  EXPECT_EQ(o.place.reserve, 4);
  EXPECT_EQ(o.place.small, 6);
  EXPECT_EQ(o.grid, 64);
  EXPECT_TRUE(o.serialized);
  EXPECT_DOUBLE_EQ(o.watchdog_ms, 2.5);
  const MonoOptions p = parse_options("reserve=2");
  EXPECT_EQ(p.place.reserve, 2);
  EXPECT_EQ(p.place.pin, d.place.pin);
  EXPECT_EQ(p.poll_ns, d.poll_ns);
  EXPECT_EQ(p.grid, d.grid);
  EXPECT_EQ(parse_options("").place.reserve, d.place.reserve);
  auto fails_naming = [](const std::string& text, const std::string& what) {
    try {
      parse_options(text);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "'" << text << "' was accepted";
  };
  EXPECT_FALSE(d.place.fp8_whole);
  EXPECT_TRUE(parse_options("fp8_whole=1").place.fp8_whole);
  fails_naming("reserv=3", "reserv");
  fails_naming("reserve=3x", "reserve=3x");
  fails_naming("poll_ns", "poll_ns");
  fails_naming("=5", "=5");
}

// fp8_whole: the decode tiles over split activations (and nothing else) take the whole walk's code,
// with the same group, shared memory and items; off, the table is what it was.
TEST(MonoTaskTable, Fp8WholeTakesTheSplitTilesOnly) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<native::OpCall> ops;
  int split = 0;
  for (int layer = 0; layer < 4; ++layer)
    for (int i = 0; i < 6; ++i) {
      native::OpCall c = random_op(rng, layer);
      if (auto* mp = std::get_if<kernels::MmaLinearParams>(&c.params); mp && rng() % 2) {
        mp->xfmt = kernels::ActFmt::F32Split;
        ++split;
      }
      ops.push_back(c);
    }
  TablePlacement off{true, 0, 8, 0}, on = off;
  on.fp8_whole = true;
  const TaskTable a = build_task_table(ops, 32, 512, 200 * 1024, nullptr, off);
  const TaskTable b = build_task_table(ops, 32, 512, 200 * 1024, nullptr, on);
  ASSERT_EQ(a.ops.size(), ops.size());
  ASSERT_EQ(b.ops.size(), ops.size());
  EXPECT_EQ(check_task_order(b), "");
  int whole = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto* mp = std::get_if<kernels::MmaLinearParams>(&ops[i].params);
    const bool s = mp && mp->xfmt == kernels::ActFmt::F32Split;
    EXPECT_EQ(a.ops[i].code, s ? uint8_t(OpCode::MmaDecodeFp8Split) : b.ops[i].code) << "op " << i;
    EXPECT_EQ(b.ops[i].code, s ? uint8_t(OpCode::MmaDecodeFp8SplitWhole) : a.ops[i].code) << "op " << i;
    EXPECT_EQ(a.ops[i].smem, b.ops[i].smem) << "op " << i;
    EXPECT_EQ(a.ops[i].groups, b.ops[i].groups) << "op " << i;
    EXPECT_EQ(a.ops[i].items, b.ops[i].items) << "op " << i;
    whole += b.ops[i].code == uint8_t(OpCode::MmaDecodeFp8SplitWhole);
  }
  EXPECT_EQ(whole, split);
}

// Staging: every FP8 decode projection (and nothing else) is marked staged, its group's shared
// memory holds the chain partials and then, at a 128-byte boundary, the 16 rows of its tile at the
// padded stride; the groups shrink to what the CTA's shared memory holds; stage = 0 leaves the
// table as it was.
TEST(MonoTaskTable, StagedProjectionsHoldTheirTile) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<native::OpCall> ops;
  for (int layer = 0; layer < 4; ++layer)
    for (int i = 0; i < 6; ++i) {
      native::OpCall c = random_op(rng, layer);
      if (auto* mp = std::get_if<kernels::MmaLinearParams>(&c.params)) mp->ld_w = 16 * (1 + int64_t(rng() % 700));  // tiles up to 178 KB
      ops.push_back(c);
    }
  const int cta_smem = 200 * 1024;
  const TaskTable on = build_task_table(ops, 32, 512, cta_smem, nullptr, TablePlacement{true, 0, 8, 1});
  TablePlacement walk{true, 0, 8, 0}, streamed = walk;
  walk.stream = false;
  streamed.stream = true;
  const TaskTable off = build_task_table(ops, 32, 512, cta_smem, nullptr, walk);
  const TaskTable str = build_task_table(ops, 32, 512, cta_smem, nullptr, streamed);
  ASSERT_EQ(on.ops.size(), ops.size());
  ASSERT_EQ(off.ops.size(), ops.size());
  ASSERT_EQ(str.ops.size(), ops.size());
  ASSERT_EQ(check_task_order(on), "");
  ASSERT_EQ(check_task_order(str), "");
  int staged = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const MonoOp &a = on.ops[i], &b = off.ops[i];
    EXPECT_EQ(b.stage, 0);
    const auto* mp = std::get_if<kernels::MmaLinearParams>(&ops[i].params);
    if (!mp) {
      EXPECT_EQ(a.stage, 0);
      EXPECT_EQ(a.smem, b.smem);
      EXPECT_EQ(a.groups, b.groups);
      continue;
    }
    ++staged;
    // streamed: the same group, its chains' regions after the partials and barriers
    const MonoOp& c = str.ops[i];
    EXPECT_EQ(c.code, uint8_t(OpCode::MmaStreamFp8F32)) << "op " << i;
    EXPECT_EQ(b.code, uint8_t(OpCode::MmaDecodeFp8F32)) << "op " << i;
    EXPECT_EQ(a.code, uint8_t(OpCode::MmaDecodeFp8F32)) << "op " << i;
    EXPECT_EQ(c.threads, b.threads);
    EXPECT_EQ(c.stage, 0);
    EXPECT_GE(c.smem, kernels::mma_stream_tile_offset(mp->chains) + 16 * mp->K);  // P regions of 16 rows hold all K
    EXPECT_GE(kernels::mma_stream_tile_offset(mp->chains), kernels::mma_stream_bar_offset(mp->chains) + 8 * mp->chains);
    EXPECT_EQ(kernels::mma_stream_stride(mp->K, mp->chains) % 128 == 0, false);
    EXPECT_LE(int(c.groups) * c.smem, cta_smem);
    EXPECT_EQ(a.stage, 1) << "op " << i;
    const int64_t stride = kernels::mma_staged_stride(mp->ld_w);
    EXPECT_EQ(stride % 128, 64) << "ld_w " << mp->ld_w;
    EXPECT_GE(stride, mp->ld_w);
    const int off_tile = kernels::mma_staged_tile_offset(mp->chains);
    EXPECT_EQ(off_tile % 128, 0);
    EXPECT_GE(off_tile, b.smem) << "the tile overlaps the chain partials";
    EXPECT_GE(a.smem, off_tile + 16 * stride);
    EXPECT_EQ(a.smem % 128, 0);
    EXPECT_LE(int(a.groups) * a.smem, cta_smem);
    EXPECT_GE(a.groups, 1);
    EXPECT_LE(a.groups, b.groups);
    EXPECT_LE(on.max_smem, cta_smem);
  }
  if (staged == 0) GTEST_SKIP() << "no projection drawn with this seed";
}

// A MoE layer's ops as the decode plan lays them out (post norm, router GEMV, routing, split,
// gate/up, down, combine), with their buffers shared the way the plan shares them.
// fused: the router GEMV that routes (one op) instead of the GEMV and the route.
std::vector<native::OpCall> moe_layer_ops(int layer, int M, std::vector<std::vector<uint8_t>>& bufs,
                                          bool fused = false) {
  auto buf = [&](size_t bytes) {
    bufs.emplace_back(bytes);
    return bufs.back().data();
  };
  auto* x = reinterpret_cast<float*>(buf(4096));
  auto* slot = reinterpret_cast<int32_t*>(buf(1024));
  auto* num = reinterpret_cast<int32_t*>(buf(64));
  std::vector<native::OpCall> ops;
  auto add = [&](native::OpKind k, const char* name, native::OpParams p) {
    native::OpCall c;
    c.kind = k;
    c.name = name;
    c.stage = "test";
    c.layer = layer;
    c.params = p;
    ops.push_back(c);
  };
  kernels::RmsNormParams np;
  np.M = M;
  np.n = 256;
  np.y = x;
  add(native::OpKind::RmsNorm, "post_norm", np);
  kernels::GemvParams gp;
  gp.x = x;
  gp.N = 16;
  gp.K = 256;
  gp.M = M;
  gp.wfmt = kernels::WeightFmt::F32;
  gp.rows = 1;  // as make_gemv_params picks for a router of a few rows
  gp.mt = M <= 1 ? 1 : M <= 2 ? 2 : 4;
  gp.y = reinterpret_cast<float*>(buf(1024));
  gp.ld_y = 16;
  kernels::MoeRouteParams rp;
  rp.select.M = rp.group.M = M;
  rp.select.K = rp.group.K = 4;
  rp.select.E = rp.group.E = gp.N;
  rp.select.logits = gp.y;
  rp.select.ld = gp.ld_y;
  rp.group.entry_slot = slot;
  rp.group.num_entries = num;
  if (fused) {
    kernels::RouterGemvRouteParams fp{gp, rp, reinterpret_cast<int32_t*>(buf(16))};
    EXPECT_TRUE(kernels::router_gemv_route_fits(fp.gemv, fp.route));
    add(native::OpKind::RouterGemvRoute, "router", fp);
  } else {
    add(native::OpKind::Gemv, "router", gp);
    add(native::OpKind::MoeRoute, "route", rp);
  }
  kernels::MoeSplitParams sp;
  sp.x = x;
  sp.K = 256;
  sp.M = M;
  sp.ld_xs = 512;
  add(native::OpKind::MoeSplit, "split", sp);
  for (const char* name : {"gate_up", "down"}) {
    kernels::MoeMmaParams mp;
    mp.N = 64;
    mp.K = 256;
    mp.ld = 128;
    mp.sld = 8;
    mp.chains = 2;
    mp.stages = 3;
    mp.max_entries = 5;
    mp.entry_slot = slot;
    mp.num_entries = num;
    add(native::OpKind::MoeMma, name, mp);
  }
  kernels::MoeCombineParams cp;
  cp.H = 256;
  cp.M = M;
  add(native::OpKind::MoeCombine, "combine", cp);
  return ops;
}

// The same with the router GEMV that routes (one op before the split): the split waits for the
// norm, gate/up for the split and the fused router.
static void check_early_split(bool fused) {
  SCOPED_TRACE(fused ? "fused router" : "router then route");
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<native::OpCall> ops;
  for (int l = 0; l < 3; ++l) {
    auto v = moe_layer_ops(l, 1 + int(rng() % 4), bufs, fused);
    ops.insert(ops.end(), v.begin(), v.end());
  }
  TablePlacement early;  // the defaults
  TablePlacement plain;
  plain.early = false;
  plain.ring = 1;
  EXPECT_TRUE(early.early);
  EXPECT_EQ(early.ring, 0);
  std::vector<std::string> why;
  const TaskTable base = build_task_table(ops, 16, 512, 96 * 1024, &why, plain);
  ASSERT_TRUE(why.empty()) << why.front();
  const TaskTable t = build_task_table(ops, 16, 512, 96 * 1024, nullptr, early);
  ASSERT_EQ(t.ops.size(), ops.size());
  ASSERT_EQ(check_task_order(t), "");
  const int per = fused ? 6 : 7;  // ops per layer
  const int ks = fused ? 2 : 3;   // the split's place in the layer; gate/up follows
  const int back = fused ? 2 : 3; // the split's wait: the norm
  for (size_t i = 0; i < ops.size(); ++i) {
    const int k = int(i) % per;
    EXPECT_EQ(base.ops[i].wait_op, int(i) - 1);
    EXPECT_EQ(base.ops[i].wait_op2, -1);
    EXPECT_EQ(t.ops[i].wait_op, k == ks ? int(i) - back : int(i) - 1) << "op " << i;
    EXPECT_EQ(t.ops[i].wait_op2, k == ks + 1 ? int(i) - 2 : -1) << "op " << i;
    if (fused && k == 1) {
      const int m = std::get<kernels::RouterGemvRouteParams>(ops[i].params).gemv.mt;
      EXPECT_EQ(t.ops[i].code, uint8_t(m == 1 ? OpCode::RouterRouteF32M1 : m == 2 ? OpCode::RouterRouteF32M2
                                                                                 : OpCode::RouterRouteF32M4));
    }
    if (k == ks + 1 || k == ks + 2) {
      EXPECT_EQ(base.ops[i].code, uint8_t(OpCode::MoeWideStaged3));
      EXPECT_EQ(t.ops[i].code, uint8_t(OpCode::MoeWideRegs));
      EXPECT_LT(t.ops[i].smem, base.ops[i].smem);
      EXPECT_EQ(t.ops[i].smem, (kernels::moe_wide_smem_bytes(2, 0) + 15) / 16 * 16);
    } else {
      EXPECT_EQ(t.ops[i].code, base.ops[i].code);
    }
  }
  // the ops each one reads from: the previous op, except split (the norm) and gate/up (split, route)
  auto inputs = [&](int i) {
    const int k = i % per;
    if (k == ks) return std::vector<int>{i - back};
    if (k == ks + 1) return std::vector<int>{i - 1, i - 2};
    return i > 0 ? std::vector<int>{i - 1} : std::vector<int>{};
  };
  bool split_beside = false;  // some interleaving ran a split item before the routing ended
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> done(t.ops.size(), 0);
    const int64_t ran = simulate(t, rng, [&](int op) {
      if (op % per == ks && done[size_t(op - 1)] < t.ops[size_t(op - 1)].items) split_beside = true;
      ++done[size_t(op)];
      return inputs(op);
    });
    ASSERT_EQ(ran, t.num_tasks()) << "deadlock";
  }
  EXPECT_TRUE(split_beside) << "the split never ran beside the routing";
  // a second wait on a later op is caught
  TaskTable bad = t;
  bad.ops[size_t(ks + 1)].wait_op2 = ks + 2;
  EXPECT_NE(check_task_order(bad), "");
}

// early: the split waits for the norm (its only input) instead of the routing, gate/up for the
// split and the routing; a simulated run under the kernel's rule (both waits) never starts an op
// before the ops it reads from, and never deadlocks. ring = false puts the staged-ring expert ops
// on the register path with only their partials' shared memory. Without them the table is as it was.
TEST(MonoTaskTable, EarlySplitAndRegisterPath) {
  check_early_split(false);
  check_early_split(true);
}

// A plan with the fused down projection (OpKind::MoeDownCombine, native only) gives the table of the
// same plan unfused, op for op: the down op's code, items, shared memory and params, then the combine
// with its own params (the next layer's norm prep included), every wait the same.
TEST(MonoTaskTable, FusedDownCombineRunsAsItsTwoOps) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<native::OpCall> plain, fused;
  int32_t counters[8] = {};
  for (int l = 0; l < 3; ++l) {
    auto v = moe_layer_ops(l, 1 + int(rng() % 4), bufs, true);
    auto& cp = std::get<kernels::MoeCombineParams>(v.back().params);
    cp.nout.n = int(rng() % 1000);  // a field the copy must keep
    plain.insert(plain.end(), v.begin(), v.end());
    const auto& d = std::get<kernels::MoeMmaParams>(v[v.size() - 2].params);
    native::OpCall f{native::OpKind::MoeDownCombine, "test", "down", l, kernels::MoeDownCombineParams{d, cp, counters}};
    v.pop_back();
    v.back() = f;
    fused.insert(fused.end(), v.begin(), v.end());
  }
  ASSERT_EQ(fused.size() + 3, plain.size());
  std::vector<std::string> why;
  const TaskTable a = build_task_table(plain, 16, 512, 96 * 1024, &why);
  const TaskTable b = build_task_table(fused, 16, 512, 96 * 1024, &why);
  ASSERT_TRUE(why.empty()) << why.front();
  ASSERT_EQ(a.ops.size(), b.ops.size());
  EXPECT_EQ(check_task_order(b), "");
  for (size_t i = 0; i < a.ops.size(); ++i) {
    SCOPED_TRACE("op " + std::to_string(i));
    EXPECT_EQ(a.ops[i].code, b.ops[i].code);
    EXPECT_EQ(a.ops[i].items, b.ops[i].items);
    EXPECT_EQ(a.ops[i].smem, b.ops[i].smem);
    EXPECT_EQ(a.ops[i].groups, b.ops[i].groups);
    EXPECT_EQ(a.ops[i].wait_op, b.ops[i].wait_op);
    EXPECT_EQ(a.ops[i].wait_op2, b.ops[i].wait_op2);
    EXPECT_EQ(a.ops[i].layer, b.ops[i].layer);
    EXPECT_EQ(std::memcmp(a.ops[i].params, b.ops[i].params, kParamBytes), 0);
  }
  EXPECT_EQ(a.tasks.size(), b.tasks.size());
}

// Placement: pinned, every op of a code runs its item w on the same CTA in every layer; with
// reserve R, the small ops (at most `small` items) run only on the last R CTAs and nothing else runs
// there; round robin continues where the previous op ended. Every table stays in the global order
// (check_task_order) and a simulated run of it completes (the test above runs the default).
TEST(MonoTaskTable, PlacementPinsOpsAndReservesCtas) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<native::OpCall> ops;
  for (int layer = 0; layer < 6; ++layer)
    for (int i = 0; i < 5; ++i) ops.push_back(random_op(rng, layer));
  const int grid = 40;
  for (const TablePlacement place : {TablePlacement{true, 0, 8}, TablePlacement{true, 4, 4}, TablePlacement{false, 0, 8},
                                     TablePlacement{false, 3, 2}}) {
    SCOPED_TRACE(fmt::format("pin {} reserve {} small {}", place.pin, place.reserve, place.small));
    const TaskTable t = build_task_table(ops, grid, 512, 96 * 1024, nullptr, place);
    ASSERT_EQ(check_task_order(t), "");
    const int wide = grid - place.reserve;
    // (op code, items, item) -> CTAs over the layers (the random ops of one code differ in size;
    // a model's layers do not)
    std::map<std::tuple<int, int64_t, int>, std::set<int>> ctas;
    for (int c = 0; c < grid; ++c)
      for (int32_t i = t.cta_begin[size_t(c)]; i < t.cta_begin[size_t(c + 1)]; ++i) {
        const MonoTask k = t.tasks[size_t(i)];
        const MonoOp& o = t.ops[size_t(k.op)];
        const bool small = place.reserve > 0 && o.items <= place.small;
        if (small) {
          EXPECT_GE(c, wide) << "a small op outside the reserved CTAs";
        } else {
          EXPECT_LT(c, wide) << "op " << k.op << " (" << o.items << " items) on a reserved CTA";
        }
        if (!place.pin && !small) {
          EXPECT_EQ(c, (o.first_task + k.item) % wide);
        }
        ctas[{o.code, o.items, k.item}].insert(c);
      }
    if (place.pin) {
      for (const auto& [key, cs] : ctas) {
        EXPECT_EQ(cs.size(), 1u) << "op code " << std::get<0>(key) << " item " << std::get<2>(key);
      }
    }
  }
  std::vector<std::string> why;
  EXPECT_TRUE(build_task_table(ops, grid, 512, 96 * 1024, &why, TablePlacement{true, grid, 8}).ops.empty());
  EXPECT_TRUE(any_contains(why, "reserved")) << (why.empty() ? "" : why[0]);
}

