// Greedy EAGLE3 drafts (runtime/drafter.h) over a draft network that runs anywhere: the CPU
// reference (ref/eagle3.h) or one GPU (native/eagle3_net.h). The network keeps each sequence's
// draft K/V and the pre-norm rows its next row reads; the drafter keeps the positions.
//   observe(seq, start, next, aux): rows start .. start + n - 1 with tokens next[] over the target's
//     aux states (through fc); the last row's argmax is the first draft.
//   propose(seq, k): draft 0 is that argmax; draft i (i >= 1) is the argmax of the row at position
//     len + i - 1 with token draft i - 1 over the pre-norm output of the row before it (the last
//     observed row for i = 1); those positions' K/V are overwritten when the target's kept tokens
//     there are observed.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/eagle3_spec.h"
#include "runtime/drafter.h"

namespace m3 {

// One sequence inside a network: its draft K/V and pre-norm rows (the network's own type).
class Eagle3SeqState {
 public:
  virtual ~Eagle3SeqState() = default;
};

class Eagle3Net {
 public:
  virtual ~Eagle3Net() = default;
  virtual const Eagle3Spec& spec() const = 0;
  virtual std::unique_ptr<Eagle3SeqState> new_sequence() = 0;
  // Rows at positions start .. start + n - 1 (n = tokens.size() >= 1) over aux (n rows of fc_in
  // floats, host memory): their K/V written, the last row's pre-norm output kept as the sequence's
  // observed row. Returns the last row's greedy draft (a target id).
  virtual int32_t observe(Eagle3SeqState& s, int32_t start, std::span<const int32_t> tokens, const float* aux) = 0;
  // One row at `pos` with `token` over the observed row (from_observed) or the previous draft() row:
  // its K/V written at pos, its pre-norm output kept for the next draft(). Returns its greedy draft.
  virtual int32_t draft(Eagle3SeqState& s, int32_t pos, int32_t token, bool from_observed) = 0;
  // n >= 1 chained draft rows: row j at pos + j, over the observed row (j = 0) or row j - 1, with
  // `token` (j = 0) or out[j - 1]; out[j] = row j's greedy draft. The same as n draft() calls (this
  // default); a network may run the chain without a host round trip between its rows.
  virtual void draft_chain(Eagle3SeqState& s, int32_t pos, int32_t token, int n, int32_t* out) {
    for (int j = 0; j < n; ++j) out[j] = draft(s, pos + j, j == 0 ? token : out[j - 1], j == 0);
  }
};

// The target id of the largest of n draft logits (target id = i + d2t[i]; d2t empty: i), the lowest
// target id among equal ones (as an argmax over the target vocabulary with -inf where no draft id
// maps); NaN logits never win; all -inf or NaN: 0.
int32_t eagle3_greedy(const float* draft_logits, int n, const std::vector<int32_t>& d2t);

class Eagle3Drafter final : public Drafter {
 public:
  explicit Eagle3Drafter(std::shared_ptr<Eagle3Net> net) : net_(std::move(net)) {}
  std::string name() const override { return "eagle3"; }
  const std::vector<int>& aux_layers() const override { return net_->spec().aux_layers; }
  void observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) override;
  std::vector<int32_t> propose(uint64_t seq, int k) override;
  void release(uint64_t seq) override { seqs_.erase(seq); }
  size_t sequences() const { return seqs_.size(); }
  const Eagle3Net& net() const { return *net_; }

 private:
  struct Seq {
    std::unique_ptr<Eagle3SeqState> state;
    int32_t len = 0;     // positions observed
    int32_t first = -1;  // the last observed row's draft
  };
  std::shared_ptr<Eagle3Net> net_;
  std::unordered_map<uint64_t, Seq> seqs_;
};

}  // namespace m3
