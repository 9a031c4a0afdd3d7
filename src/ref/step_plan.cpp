// plan_step(): validation first (nothing is written before every check passed), then the plan.
#include "ref/step_plan.h"

#include <algorithm>

#include "core/check.h"

namespace m3::ref {

StepPlan plan_step(const ModelSpec& spec, const PagedCache& cache, const StepBatch& batch) {
  M3_CHECK(!batch.seqs.empty(), "step: the batch has no sequences");
  const int bs = cache.block_size();
  StepPlan p;
  p.seq_slots.resize(batch.seqs.size());
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqStep& q = batch.seqs[s];
    const int64_t n = int64_t(q.tokens.size());
    M3_CHECK(n >= 1, "step: sequence {} has no tokens", s);
    M3_CHECK(q.start_pos >= 0, "step: sequence {} has start_pos {} < 0", s, q.start_pos);
    const int64_t end = int64_t(q.start_pos) + n;
    M3_CHECK(spec.max_positions <= 0 || end <= spec.max_positions,
             "step: sequence {} reaches position {} but max_position_embeddings is {}", s, end - 1,
             spec.max_positions);
    M3_CHECK(end <= int64_t(INT32_MAX), "step: sequence {} reaches position {}", s, end - 1);
    const int64_t need = (end + bs - 1) / bs;
    M3_CHECK(int64_t(q.block_table.size()) >= need,
             "step: sequence {} covers positions [0, {}) which need {} blocks of {}, its block table has {}", s, end,
             need, bs, q.block_table.size());
    for (int64_t b = 0; b < need; ++b) {
      int32_t id = q.block_table[size_t(b)];
      M3_CHECK(id >= 0 && id < cache.num_blocks(), "step: sequence {} block_table[{}] = {} is outside [0, {})", s, b,
               id, cache.num_blocks());
    }
    for (int64_t i = 0; i < n; ++i) {
      int32_t t = q.tokens[size_t(i)];
      M3_CHECK(t >= 0 && t < spec.vocab_size, "step: sequence {} token {} has id {} outside the vocabulary [0, {})",
               s, i, t, spec.vocab_size);
    }
    auto& ss = p.seq_slots[s];
    ss.resize(size_t(end));
    for (int64_t j = 0; j < end; ++j) ss[size_t(j)] = cache.slot_of(q.block_table, j);
    for (int64_t j = 0; j < q.start_pos; ++j) {
      int32_t w = cache.written_pos(ss[size_t(j)]);
      M3_CHECK(w == j,
               "step: sequence {} position {} maps to cache slot {} (block {}), which holds {}; the block table "
               "does not match what earlier steps wrote",
               s, j, ss[size_t(j)], q.block_table[size_t(j / bs)],
               w < 0 ? std::string("nothing") : "position " + std::to_string(w));
    }
    p.first_row.push_back(int(p.out_tokens.size()));
    p.num_rows.push_back(q.all_logits ? int(n) : 1);
    for (int64_t i = 0; i < n; ++i) {
      int tok = p.num_tokens + int(i);
      p.token_id.push_back(q.tokens[size_t(i)]);
      p.pos.push_back(int32_t(q.start_pos + i));
      p.seq.push_back(int(s));
      p.slot.push_back(ss[size_t(q.start_pos + i)]);
      if (q.all_logits || i == n - 1) p.out_tokens.push_back(tok);
    }
    p.num_tokens += int(n);
  }
  // two new tokens writing one slot would race and corrupt each other's history
  std::vector<std::pair<int64_t, int>> w;
  for (int t = 0; t < p.num_tokens; ++t) w.emplace_back(p.slot[size_t(t)], t);
  std::sort(w.begin(), w.end());
  for (size_t i = 1; i < w.size(); ++i) {
    if (w[i].first != w[i - 1].first) continue;
    int a = w[i - 1].second, b = w[i].second;
    M3_FAIL("step: sequence {} position {} and sequence {} position {} both write cache slot {}", p.seq[size_t(a)],
            p.pos[size_t(a)], p.seq[size_t(b)], p.pos[size_t(b)], w[i].first);
  }
  // and a new token must not overwrite history that another sequence of the step reads
  for (size_t s = 0; s < batch.seqs.size(); ++s)
    for (int64_t j = 0; j < batch.seqs[s].start_pos; ++j) {
      auto it = std::lower_bound(w.begin(), w.end(), std::pair<int64_t, int>(p.seq_slots[s][size_t(j)], -1));
      if (it == w.end() || it->first != p.seq_slots[s][size_t(j)]) continue;
      M3_FAIL("step: sequence {} position {} writes cache slot {}, which holds position {} of sequence {}",
              p.seq[size_t(it->second)], p.pos[size_t(it->second)], it->first, j, s);
    }
  return p;
}

}  // namespace m3::ref
