// A fake Backend for scheduler unit tests: it keeps a paged "cache" whose slot for position p holds
// a hash of the sequence's tokens 0..p (chained through the slot of p-1, read via the block table),
// and returns logits that are a pure function of the last hash. So a sequence's outputs depend on
// its whole history exactly as the cache holds it: a wrong block table, a block shared between
// live sequences, a lost prefix after preemption or a wrong start_pos all change the tokens or
// throw. It also checks every input the real backends check and can record or fail steps.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.h"
#include "runtime/backend.h"
#include "runtime/dispatcher.h"

namespace m3::test {

inline uint64_t fake_mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline ModelSpec fake_spec(int vocab = 64, int block = 4, int eos = -1, int max_positions = 4096) {
  ModelSpec s;
  s.vocab_size = vocab;
  s.index_block = block;
  s.eos_id = eos;
  s.max_positions = max_positions;
  return s;
}

class FakeBackend : public Backend {
 public:
  FakeBackend(ModelSpec spec, int num_blocks)
      : spec_(std::move(spec)), num_blocks_(num_blocks),
        hash_(size_t(num_blocks) * size_t(spec_.index_block), 0),
        pos_(size_t(num_blocks) * size_t(spec_.index_block), -1) {}

  std::string name() const override { return "fake"; }
  const ModelSpec& spec() const override { return spec_; }
  int cache_block_size() const override { return spec_.index_block; }
  int num_cache_blocks() const override { return num_blocks_; }

  std::function<void(const StepBatch&)> before_step;  // may throw to simulate a failing step
  std::vector<StepBatch> steps;                       // every batch, when record is true
  bool record = false;
  Dispatcher* paths = nullptr;  // when set, each step's path is its choice (StepOutput::path)
  uint64_t steps_run = 0;

  StepOutput step(const StepBatch& batch, SelectionTrace* = nullptr) override {
    if (before_step) before_step(batch);
    if (record) steps.push_back(batch);
    const int bs = spec_.index_block, V = spec_.vocab_size;
    M3_CHECK(!batch.seqs.empty(), "fake: empty batch");
    std::vector<int64_t> written;
    for (const auto& q : batch.seqs) {
      const int64_t end = int64_t(q.start_pos) + int64_t(q.tokens.size());
      M3_CHECK(!q.tokens.empty(), "fake: sequence without tokens");
      M3_CHECK(int64_t(q.block_table.size()) * bs >= end, "fake: block table of {} blocks does not cover {} positions",
               q.block_table.size(), end);
      for (int32_t b : q.block_table) M3_CHECK(b >= 0 && b < num_blocks_, "fake: block id {} out of range", b);
      for (int32_t t : q.tokens) M3_CHECK(t >= 0 && t < V, "fake: token {} outside the vocabulary", t);
      for (int64_t j = 0; j < q.start_pos; ++j)
        M3_CHECK(pos_[size_t(slot(q, j))] == j, "fake: position {} was never written through this block table", j);
      for (int64_t j = q.start_pos; j < end; ++j) written.push_back(slot(q, j));
    }
    std::sort(written.begin(), written.end());
    M3_CHECK(std::adjacent_find(written.begin(), written.end()) == written.end(), "fake: two tokens write one slot");

    StepOutput out;
    out.vocab = V;
    ++steps_run;
    if (paths) {
      const PathChoice c = paths->choose(batch);
      out.path = c.name;
      out.fallback_reason = c.fallback_reason;
    }
    for (const auto& q : batch.seqs) {
      uint64_t h = q.start_pos == 0 ? 0x1234 : hash_[size_t(slot(q, q.start_pos - 1))];
      for (size_t i = 0; i < q.tokens.size(); ++i) {
        int64_t p = q.start_pos + int64_t(i);
        h = fake_mix(h ^ (uint64_t(q.tokens[i]) * 1000003ull + uint64_t(p)));
        hash_[size_t(slot(q, p))] = h;
        pos_[size_t(slot(q, p))] = int32_t(p);
      }
      out.first_row.push_back(int(out.logits.size() / size_t(V)));
      out.num_rows.push_back(1);
      for (int v = 0; v < V; ++v)
        out.logits.push_back(float(int64_t(fake_mix(h + uint64_t(v)) >> 40)) / float(1 << 24));
    }
    return out;
  }

 private:
  int64_t slot(const SeqStep& q, int64_t p) const {
    return int64_t(q.block_table[size_t(p / spec_.index_block)]) * spec_.index_block + p % spec_.index_block;
  }
  ModelSpec spec_;
  int num_blocks_;
  std::vector<uint64_t> hash_;
  std::vector<int32_t> pos_;
};

}  // namespace m3::test
