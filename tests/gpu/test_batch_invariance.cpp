// Batch invariance of the CUDA native backend: a sequence's logits must be bitwise the same
// whatever else shares its steps. This is what lets the server promise that a request's greedy
// output equals running it alone (issue 5), and what the kernels are built for (fixed reduction
// orders per row: kernels/attention.cuh chunks, the linear kernels' K split by shape only).
//
// Sequence A (a prompt longer than the indexer's top-k blocks, so selection is really sparse) runs
// alone: one prefill step with every row's logits, then decode steps fed random tokens. Then, on a
// second backend with the same weights, A's prompt is cut into random chunks and A's decode steps
// are mixed with random other sequences: prefill chunks (steps of more than 16 tokens, more than
// max_tokens so passes are cut), decode rows of every bucket size (graph replay) and eager mixed
// steps. Every logits row of A must equal the alone run's bit for bit; the test prints how many
// rows differ and the largest difference when they do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

std::vector<int32_t> random_ids(int n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

struct Seq {
  std::vector<int32_t> table, tokens;  // tokens: the whole stream this sequence will be fed
  int pos = 0;
};

void run_invariance(const char* preset, int prompt_min, int prompt_max, int decode_steps, int max_tokens) {
  const uint64_t seed = model_test_seed();
  SCOPED_TRACE(std::string(preset) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec spec = synthetic_preset(preset);
  SyntheticOptions so;
  so.seed = seed;
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int bs = spec.index_block, V = spec.vocab_size;
  const int nothers = 12;
  const int max_len = prompt_max + decode_steps + 8;
  const int per_seq = (max_len + bs - 1) / bs;
  const int blocks = per_seq * (nothers + 1);
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  o.max_tokens = max_tokens;
  o.max_model_len = per_seq * bs;
  auto alone = native::make_cuda_backend(m.pw, o);
  auto mixed = native::make_cuda_backend(m.pw, o);

  std::vector<Seq> seqs(static_cast<size_t>(nothers + 1));
  std::vector<int32_t> perm(static_cast<size_t>(blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int> plen(prompt_min, prompt_max);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].table.assign(perm.begin() + ptrdiff_t(i * size_t(per_seq)), perm.begin() + ptrdiff_t((i + 1) * size_t(per_seq)));
    seqs[i].tokens = random_ids(plen(rng) + decode_steps, V, rng);
  }
  Seq& A = seqs[0];
  const int LA = int(A.tokens.size()) - decode_steps;
  std::printf("  [%s] prompt %d, %d decode steps, max_tokens %d, %d other sequences\n", preset, LA, decode_steps,
              max_tokens, nothers);

  // Alone: logits of every position of A (prefill rows, then each decode step).
  std::vector<std::vector<float>> want;
  {
    StepBatch b;
    b.seqs.push_back({0, std::vector<int32_t>(A.tokens.begin(), A.tokens.begin() + LA), A.table, true});
    StepOutput out = alone->step(b);
    for (int r = 0; r < LA; ++r)
      want.emplace_back(out.logits.begin() + ptrdiff_t(size_t(r) * V), out.logits.begin() + ptrdiff_t(size_t(r + 1) * V));
    for (int k = 0; k < decode_steps; ++k) {
      StepBatch d;
      d.seqs.push_back({LA + k, {A.tokens[size_t(LA + k)]}, A.table, false});
      StepOutput o1 = alone->step(d);
      want.emplace_back(o1.logits.begin(), o1.logits.begin() + V);
    }
  }

  // Mixed: A's tokens in random chunks, each step with random company.
  int64_t rows = 0, rows_differ = 0, prefill_differ = 0, steps = 0, big_steps = 0, decode_only = 0;
  double worst = 0;
  std::string first;
  std::uniform_int_distribution<int> coin(0, 99);
  while (A.pos < int(A.tokens.size())) {
    StepBatch b;
    const bool prefill = A.pos < LA;
    const int n = prefill ? std::min(LA - A.pos, std::uniform_int_distribution<int>(1, 3 * bs)(rng)) : 1;
    // Company: other sequences at random, a prefill chunk or a decode row each.
    std::vector<size_t> order(seqs.size() - 1);
    std::iota(order.begin(), order.end(), 1);
    std::shuffle(order.begin(), order.end(), rng);
    const int company = std::uniform_int_distribution<int>(0, nothers)(rng);
    const bool decode_step = !prefill && coin(rng) < 50;  // only decode rows: a graph bucket
    std::vector<std::pair<size_t, int>> parts;  // (sequence, tokens)
    for (int c = 0; c < company; ++c) {
      Seq& s = seqs[order[size_t(c)]];
      const int left = int(s.tokens.size()) - s.pos;
      if (left <= 0) continue;
      int k = 1;
      if (!decode_step && s.pos > 0 ? coin(rng) < 30 : !decode_step) k = std::min(left, std::uniform_int_distribution<int>(1, 2 * bs)(rng));
      if (decode_step && s.pos == 0) continue;  // a decode row needs history
      parts.emplace_back(order[size_t(c)], k);
    }
    // A's place in the batch is random too.
    const size_t at = std::uniform_int_distribution<size_t>(0, parts.size())(rng);
    parts.insert(parts.begin() + ptrdiff_t(at), {0, n});
    for (auto [i, k] : parts) {
      Seq& s = seqs[i];
      b.seqs.push_back({s.pos, std::vector<int32_t>(s.tokens.begin() + s.pos, s.tokens.begin() + s.pos + k), s.table,
                        i == 0});
    }
    StepOutput out = mixed->step(b);
    ++steps;
    big_steps += b.num_tokens() > 16;
    bool all_one = true;
    for (auto& s : b.seqs) all_one = all_one && s.tokens.size() == 1;
    decode_only += all_one;
    const int r0 = out.first_row[at], nr = out.num_rows[at];
    EXPECT_EQ(nr, n);
    for (int r = 0; r < nr && r < n; ++r) {
      const float* got = out.logits.data() + size_t(r0 + r) * V;
      const std::vector<float>& w = want[size_t(A.pos + r)];
      ++rows;
      if (std::memcmp(got, w.data(), size_t(V) * 4) != 0) {
        double md = 0;
        for (int v = 0; v < V; ++v) md = std::max(md, std::fabs(double(got[v]) - w[size_t(v)]));
        worst = std::max(worst, md);
        prefill_differ += A.pos + r < LA;
        if (rows_differ++ == 0)
          first = "position " + std::to_string(A.pos + r) + " in a step of " + std::to_string(b.num_tokens()) +
                  " tokens / " + std::to_string(b.seqs.size()) + " sequences, max |diff| " + std::to_string(md);
      }
    }
    for (auto [i, k] : parts) seqs[i].pos += k;
  }
  std::printf("  [%s] %lld steps (%lld over 16 tokens, %lld decode-only), %lld rows of A compared, %lld differ "
              "(%lld prefill rows), worst |diff| %.3g%s%s\n",
              preset, (long long)steps, (long long)big_steps, (long long)decode_only, (long long)rows,
              (long long)rows_differ, (long long)prefill_differ, worst, first.empty() ? "" : "; first: ", first.c_str());
  EXPECT_EQ(rows_differ, 0) << "logits of A depend on the batch; first: " << first;
  EXPECT_GT(big_steps, 0);
  EXPECT_GT(decode_only, 0);
}

}  // namespace

TEST(GpuCudaBackend, RowsDoNotDependOnTheBatchTiny) { run_invariance("tiny", 90, 200, 40, 64); }
TEST(GpuCudaBackend, RowsDoNotDependOnTheBatchRealHeads) { run_invariance("real-heads", 2100, 2300, 24, 512); }
