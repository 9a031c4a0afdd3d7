// An independent, deliberately plain float64 implementation of the MiniMax-M3 text model over a
// whole sequence (no cache, no paging, no threads), written straight from docs m3-model.md. Tests
// compare the reference engine with it on random specs, beyond the shapes of the golden fixtures.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/spec.h"
#include "model/weights.h"

namespace m3::test {

struct NaiveResult {
  int vocab = 0;
  std::vector<double> logits;  // [T, vocab]
  // indexer choices: [sparse layer][token][group] -> ascending block ids
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> blocks;
  // Smallest margin of any discrete choice, relative to the scale of its row: between the last kept
  // and the first dropped block score (over max |score| of the row), and between the last chosen and
  // the first unchosen router choice score. A float32 engine may decide differently below ~1e-5.
  double min_block_gap = 1e300;
  double min_router_gap = 1e300;
};

// Optional rounding of what a cached engine stores: called for every element of K (after norm and
// RoPE), V and index-K (after norm and RoPE) with kind 'k', 'v' or 'i', the layer and the value;
// returns the value the engine reads back. Empty: exact.
using CacheRound = std::function<double(char kind, int layer, double x)>;

NaiveResult naive_forward(const ModelSpec& spec, const ModelWeights& w, const std::vector<int32_t>& tokens,
                          const CacheRound& round = {});

}  // namespace m3::test
