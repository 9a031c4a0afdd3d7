// A test drafter (runtime/drafter.h) around an EAGLE3 drafter: it records what the inner drafter
// proposes at each point of each sequence (with the history observed so far), but hands the
// caller the plain run's next tokens (`full`: prompt + plain output per sequence id) with one
// changed at random in two of three proposals, so verify steps keep 0 .. k drafts and the inner
// drafter observes kept runs of every length. Used by the CPU and GPU EAGLE3 tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ref/eagle3.h"
#include "runtime/drafter.h"

namespace m3::test {

class RecordingDrafter final : public Drafter {
 public:
  RecordingDrafter(std::shared_ptr<ref::Eagle3Drafter> inner, std::vector<std::vector<int32_t>> full,
                   unsigned seed)
      : inner_(std::move(inner)), full_(std::move(full)), rng_(seed) {}
  std::string name() const override { return "recording"; }
  const std::vector<int>& aux_layers() const override { return inner_->aux_layers(); }
  void observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) override {
    auto& h = seen_[seq];
    EXPECT_LE(size_t(start), h.size()) << "sequence " << seq;
    h.resize(size_t(start));
    h.insert(h.end(), next.begin(), next.end());
    observes_ += 1;
    if (start > 0) longest_ = std::max(longest_, int(next.size()));  // after the prompt's observe
    inner_->observe(seq, start, next, aux);
  }
  std::vector<int32_t> propose(uint64_t seq, int k) override {
    Point p{seq, seen_[seq], k, inner_->propose(seq, k)};
    EXPECT_EQ(int(p.drafts.size()), k);
    points_.push_back(p);
    // the plain run's continuation after the last observed token, one token spoiled at random
    const auto& f = full_[seq];
    const size_t at = p.history.size() + 1;  // full_ holds prompt + output; history starts at token 1
    std::vector<int32_t> d;
    for (size_t i = at; i < f.size() && int(d.size()) < k; ++i) d.push_back(f[i]);
    if (!d.empty() && rng_() % 3 != 0) d[rng_() % d.size()] ^= 1;
    return d;
  }
  void release(uint64_t seq) override {
    seen_.erase(seq);
    inner_->release(seq);
  }
  struct Point {
    uint64_t seq;
    std::vector<int32_t> history;  // tokens 1 .. len observed
    int k;
    std::vector<int32_t> drafts;
  };
  std::vector<Point> points_;
  int observes_ = 0, longest_ = 0;

 private:
  std::shared_ptr<ref::Eagle3Drafter> inner_;
  std::vector<std::vector<int32_t>> full_;
  std::mt19937 rng_;
  std::map<uint64_t, std::vector<int32_t>> seen_;
};

}  // namespace m3::test
