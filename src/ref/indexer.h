// The MSA indexer of one KV group for one query at position p (see docs m3-model.md, "MSA"):
//   1. scores s[j] = iq . IK[j] for every visible key j <= p, fp32 result, no scale;
//   2. block max-pool B[b] = max_{j in block b, j <= p} s[j] (blocks of `block` tokens from 0);
//   3. the `local` blocks ending at p's own block (p/bs, p/bs - 1, ... clamped at 0) forced +inf;
//   4. the top min(topk, number of blocks) blocks kept, ties to the lower block index, blocks
//      scoring -inf (or NaN) never kept.
// A prefill token at p selects exactly as a decode token at p would: everything here is per query.
#pragma once
#include <cstdint>
#include <vector>

namespace m3::ref {

// scores[j] = float(iq . ik[slots[j]]) for j < n (ik rows `stride` floats apart, dim used).
void index_scores(const float* iq, const float* ik, int64_t stride, const int64_t* slots, int n, int dim,
                  float* scores);

// Max-pool of scores over keys [0, n_keys) into ceil(n_keys / block) block scores.
std::vector<float> block_max_pool(const float* scores, int n_keys, int block);

// Step 3-4 over block scores [0, num_blocks); query_block = p / block. Returns the kept block ids
// in ascending order.
std::vector<int32_t> select_blocks(const float* block_scores, int num_blocks, int query_block, int topk,
                                   int local);

}  // namespace m3::ref
