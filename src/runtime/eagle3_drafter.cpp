// runtime/eagle3_drafter.h.
#include "runtime/eagle3_drafter.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace m3 {

int32_t eagle3_greedy(const float* draft_logits, int n, const std::vector<int32_t>& d2t) {
  float best = -std::numeric_limits<float>::infinity();
  int32_t id = 0;
  for (int i = 0; i < n; ++i) {
    const float v = draft_logits[i];
    const int32_t t = i + (d2t.empty() ? 0 : d2t[size_t(i)]);
    if (v > best || (v == best && v > -std::numeric_limits<float>::infinity() && t < id)) best = v, id = t;
  }
  return id;
}

void Eagle3Drafter::observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) {
  if (next.empty()) return;
  Seq& s = seqs_[seq];
  M3_CHECK(start >= 0 && start <= s.len,
           "EAGLE3 drafter: sequence {} observed from position {} but it has seen positions [0, {}) only", seq, start,
           s.len);
  if (!s.state) s.state = net_->new_sequence();
  s.first = -1;  // a failed row leaves nothing to propose from
  s.first = net_->observe(*s.state, start, next, aux);
  s.len = start + int32_t(next.size());
}

std::vector<int32_t> Eagle3Drafter::propose(uint64_t seq, int k) {
  auto it = seqs_.find(seq);
  if (k <= 0 || it == seqs_.end() || it->second.first < 0) return {};
  Seq& s = it->second;
  std::vector<int32_t> drafts(size_t(k), s.first);
  if (k > 1) net_->draft_chain(*s.state, s.len, s.first, k - 1, drafts.data() + 1);
  return drafts;
}

}  // namespace m3
