#include "ref/greedy_run.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "runtime/sampler.h"

namespace m3::ref {

int64_t greedy_positions(size_t prompt_len, int steps) { return int64_t(prompt_len) + steps - 1; }

double top2_margin(const float* logits, int vocab) {
  M3_CHECK(vocab >= 2, "top2_margin: vocab {} < 2", vocab);
  double a = -std::numeric_limits<double>::infinity(), b = a;
  for (int v = 0; v < vocab; ++v) {
    const double x = logits[v];
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

GreedyRun greedy_run(Backend& b, const std::vector<int32_t>& prompt, int steps, const GreedyOptions& opt) {
  M3_CHECK(!prompt.empty(), "greedy run: empty prompt");
  M3_CHECK(steps >= 1, "greedy run: steps must be >= 1, got {}", steps);
  const int64_t positions = greedy_positions(prompt.size(), steps);
  const int bs = b.cache_block_size();
  const int64_t blocks = (positions + bs - 1) / bs;
  M3_CHECK(blocks <= b.num_cache_blocks(), "greedy run: {} positions need {} cache blocks, the backend has {}",
           positions, blocks, b.num_cache_blocks());
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  GreedyRun run;
  int32_t pos = 0;
  for (int i = 0; i < steps; ++i) {
    std::vector<int32_t> toks = i == 0 ? prompt : std::vector<int32_t>{run.tokens.back()};
    const int32_t n = int32_t(toks.size());
    SelectionTrace trace;
    StepOutput o = b.step(StepBatch{{SeqStep{pos, std::move(toks), table, false}}}, opt.keep_traces ? &trace : nullptr);
    pos += n;
    const float* row = o.row(0);
    run.tokens.push_back(argmax_token(row, o.vocab));
    run.margins.push_back(top2_margin(row, o.vocab));
    if (opt.keep_logits) run.logits.emplace_back(row, row + o.vocab);
    if (opt.keep_traces) run.traces.push_back(std::move(trace));
    if (opt.progress) opt.progress(i + 1, steps);
  }
  return run;
}

}  // namespace m3::ref
