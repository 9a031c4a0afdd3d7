// check_step (runtime/step_check.h).
#include "runtime/step_check.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "core/check.h"

namespace m3 {

std::vector<CheckedSeq> check_step(const StepBatch& batch, const StepLimits& lim, const SlotHistory& history,
                                   HistoryCheck mode) {
  M3_CHECK(!batch.seqs.empty(), "step: the batch has no sequences");
  const int bs = lim.block_size;
  M3_CHECK(bs > 0 && lim.num_blocks > 0, "step: cache of {} blocks of {}", lim.num_blocks, bs);
  bool want_aux = false;
  for (const SeqStep& q : batch.seqs) want_aux = want_aux || q.want_aux;
  if (!batch.aux_layers.empty() || want_aux) {
    M3_CHECK(lim.num_layers >= 0,
             "step: this backend does not return auxiliary hidden states (aux_layers, EAGLE3 drafts); the CPU "
             "reference and the single-GPU CUDA backend do");
    M3_CHECK(!batch.aux_layers.empty(), "step: a sequence asks for auxiliary hidden states but aux_layers is empty");
    for (size_t k = 0; k < batch.aux_layers.size(); ++k) {
      const int l = batch.aux_layers[k];
      M3_CHECK(l >= 0 && l <= lim.num_layers, "step: aux_layers[{}] = {} is outside [0, {}] (the model's layers)", k,
               l, lim.num_layers);
      for (size_t j = 0; j < k; ++j)
        M3_CHECK(batch.aux_layers[j] != l, "step: aux_layers lists layer {} twice (entries {} and {})", l, j, k);
    }
  }
  std::vector<CheckedSeq> seqs(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqStep& q = batch.seqs[i];
    const int64_t n = int64_t(q.tokens.size());
    M3_CHECK(n >= 1, "step: sequence {} has no tokens", i);
    M3_CHECK(q.start_pos >= 0, "step: sequence {} has start_pos {} < 0", i, q.start_pos);
    const int64_t end = int64_t(q.start_pos) + n;
    M3_CHECK(end <= lim.max_len && end <= int64_t(INT32_MAX), "step: sequence {} reaches position {} but {} is {}", i,
             end - 1, lim.max_len_name, lim.max_len);
    const int64_t need = (end + bs - 1) / bs;
    M3_CHECK(int64_t(q.block_table.size()) >= need,
             "step: sequence {} covers positions [0, {}) which need {} blocks of {}, its block table has {}", i, end,
             need, bs, q.block_table.size());
    for (int64_t b = 0; b < need; ++b) {
      const int32_t id = q.block_table[size_t(b)];
      M3_CHECK(id >= 0 && id < lim.num_blocks, "step: sequence {} block_table[{}] = {} is outside [0, {})", i, b, id,
               lim.num_blocks);
    }
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = q.tokens[size_t(t)];
      M3_CHECK(id >= 0 && id < lim.vocab_size, "step: sequence {} token {} has id {} outside the vocabulary [0, {})",
               i, t, id, lim.vocab_size);
    }
    const std::span<const int32_t> table(q.block_table.data(), size_t(need));
    auto check_pos = [&](int64_t p) {
      const int64_t slot = slot_of(table, p, bs);
      const int32_t w = history.written(slot);
      M3_CHECK(w == p,
               "step: sequence {} position {} maps to cache slot {} (block {}), which holds {}; the block table "
               "does not match what earlier steps wrote",
               i, p, slot, table[size_t(p / bs)], w < 0 ? std::string("nothing") : "position " + std::to_string(w));
    };
    if (mode == HistoryCheck::EveryPosition) {
      for (int64_t p = 0; p < q.start_pos; ++p) check_pos(p);
    } else {
      for (int64_t b = 0; b * bs < q.start_pos; ++b) {
        check_pos(b * bs);
        check_pos(std::min<int64_t>(q.start_pos, (b + 1) * bs) - 1);
      }
    }
    seqs[i] = CheckedSeq{q.start_pos, int32_t(n), table};
  }
  // Two new tokens writing one slot would race and corrupt each other's history.
  std::vector<std::pair<int64_t, std::pair<int, int64_t>>> writes;  // slot -> (sequence, position)
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int j = 0; j < seqs[i].num_new; ++j) {
      const int64_t pos = seqs[i].start_pos + j;
      writes.push_back({slot_of(seqs[i].table, pos, bs), {int(i), pos}});
    }
  std::sort(writes.begin(), writes.end());
  for (size_t k = 1; k < writes.size(); ++k) {
    if (writes[k].first != writes[k - 1].first) continue;
    const auto& a = writes[k - 1].second;
    const auto& b = writes[k].second;
    M3_FAIL("step: sequence {} position {} and sequence {} position {} both write cache slot {}", a.first, a.second,
            b.first, b.second, writes[k].first);
  }
  // A new token must not overwrite history that a sequence of the step reads: history is read at
  // positions below start_pos, block by block.
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t b = 0; b * bs < seqs[s].start_pos; ++b) {
      const int64_t first = int64_t(seqs[s].table[size_t(b)]) * bs;
      auto it = std::lower_bound(writes.begin(), writes.end(), std::make_pair(first, std::make_pair(-1, int64_t(-1))));
      for (; it != writes.end() && it->first < first + bs; ++it) {
        const int64_t read_pos = b * bs + (it->first - first);
        if (read_pos >= seqs[s].start_pos) continue;  // past the history this sequence reads
        M3_FAIL("step: sequence {} position {} writes cache slot {}, which holds position {} of sequence {}",
                it->second.first, it->second.second, it->first, read_pos, s);
      }
    }
  return seqs;
}

}  // namespace m3
