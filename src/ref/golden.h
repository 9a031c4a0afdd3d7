// Golden fixtures written by transformers in float64 (shared/fixtures/README.md): per prompt i,
//   p{i}.ids [T] int64, p{i}.prefill_logits [T, V] f32, p{i}.prefill_blocks.layer{L} [H_idx, T, k]
//   int32 (left-packed block ids, -1 pads, order within a row not meaningful), p{i}.greedy_ids [G]
//   int64, p{i}.step_logits [G, V] f32 (row 0 = last prefill row, row g after feeding greedy_ids[g-1]).
// load_golden() reads and checks every dtype and shape, naming the key on error.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace m3::ref {

struct GoldenBlocks {  // one sparse layer's prefill selection
  int heads = 0, tokens = 0, k = 0;
  std::vector<int32_t> ids;  // [heads, tokens, k]
  const int32_t* row(int h, int t) const { return ids.data() + (size_t(h) * size_t(tokens) + size_t(t)) * size_t(k); }
};

struct GoldenPrompt {
  int index = 0;  // i of p{i}
  int vocab = 0;
  std::vector<int32_t> ids;            // [T]
  std::vector<float> prefill_logits;   // [T, vocab]
  std::map<int, GoldenBlocks> prefill_blocks;  // model layer -> selection
  std::vector<int32_t> greedy_ids;     // [G]
  std::vector<float> step_logits;      // [G, vocab]
  int tokens() const { return int(ids.size()); }
  int steps() const { return int(greedy_ids.size()); }
};

// All prompts of a golden file, in index order. Throws m3::Error naming the file and key.
std::vector<GoldenPrompt> load_golden(const std::filesystem::path& file);

}  // namespace m3::ref
