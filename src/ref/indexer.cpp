// Indexer steps as free functions so each can be tested against a direct formula.
#include "ref/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ref/linear.h"

namespace m3::ref {

void index_scores(const float* iq, const float* ik, int64_t stride, const int64_t* slots, int n, int dim,
                  float* scores) {
  for (int j = 0; j < n; ++j) scores[j] = float(dot(iq, ik + slots[j] * stride, dim));
}

std::vector<float> block_max_pool(const float* scores, int n_keys, int block) {
  int nb = (n_keys + block - 1) / block;
  std::vector<float> out(size_t(nb), -INFINITY);
  for (int j = 0; j < n_keys; ++j) {
    float& b = out[size_t(j / block)];
    if (scores[j] > b) b = scores[j];  // NaN never wins a comparison, so it never raises a block
  }
  return out;
}

std::vector<int32_t> select_blocks(const float* block_scores, int num_blocks, int query_block, int topk,
                                   int local) {
  std::vector<float> s(block_scores, block_scores + num_blocks);
  for (auto& x : s)
    if (std::isnan(x)) x = -INFINITY;
  for (int i = 0; i < local; ++i) {
    int b = query_block - i;
    if (b < 0) break;
    if (b < num_blocks) s[size_t(b)] = INFINITY;
  }
  int k = std::min(topk, num_blocks);
  std::vector<int32_t> idx(static_cast<size_t>(num_blocks));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)] || (s[size_t(a)] == s[size_t(b)] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(size_t(k));
  std::erase_if(idx, [&](int32_t b) { return s[size_t(b)] == -INFINITY; });
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace m3::ref
