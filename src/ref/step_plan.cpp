// plan_step(): the step is validated by the one shared check (runtime/step_check.h), then laid out
// as tokens (nothing is written before every check passed).
#include "ref/step_plan.h"

#include <climits>

#include "runtime/step_check.h"

namespace m3::ref {

namespace {
class CacheHistory final : public SlotHistory {
 public:
  explicit CacheHistory(const PagedCache& c) : c_(c) {}
  int32_t written(int64_t slot) const override { return c_.written_pos(slot); }

 private:
  const PagedCache& c_;
};
}  // namespace

StepPlan plan_step(const ModelSpec& spec, const PagedCache& cache, const StepBatch& batch) {
  StepLimits lim;
  lim.vocab_size = spec.vocab_size;
  lim.block_size = cache.block_size();
  lim.num_blocks = cache.num_blocks();
  lim.max_len = spec.max_positions > 0 ? int64_t(spec.max_positions) : int64_t(INT32_MAX);
  lim.max_len_name = "max_position_embeddings";
  lim.num_layers = spec.num_layers;
  const std::vector<CheckedSeq> seqs = check_step(batch, lim, CacheHistory(cache), HistoryCheck::EveryPosition);
  StepPlan p;
  p.aux_layers = batch.aux_layers;
  p.seq_slots.resize(batch.seqs.size());
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqStep& q = batch.seqs[s];
    const int64_t n = seqs[s].num_new, end = int64_t(q.start_pos) + n;
    auto& ss = p.seq_slots[s];
    ss.resize(size_t(end));
    for (int64_t j = 0; j < end; ++j) ss[size_t(j)] = slot_of(seqs[s].table, j, lim.block_size);
    p.first_row.push_back(int(p.out_tokens.size()));
    p.num_rows.push_back(q.all_logits ? int(n) : 1);
    p.aux_first_row.push_back(q.want_aux ? int(p.aux_tokens.size()) : -1);
    if (q.want_aux)
      for (int64_t i = 0; i < n; ++i) p.aux_tokens.push_back(p.num_tokens + int(i));
    for (int64_t i = 0; i < n; ++i) {
      const int tok = p.num_tokens + int(i);
      p.token_id.push_back(q.tokens[size_t(i)]);
      p.pos.push_back(int32_t(q.start_pos + i));
      p.seq.push_back(int(s));
      p.slot.push_back(ss[size_t(q.start_pos + i)]);
      if (q.all_logits || i == n - 1) p.out_tokens.push_back(tok);
    }
    p.num_tokens += int(n);
  }
  return p;
}

}  // namespace m3::ref
