// Which steps the decode buckets run, and where their output rows sit (plain C++, CPU-tested).
//
// A bucket step: no trace, at most max_graph_batch request rows, every row with the same query
// length q of 1 (decode) to kMaxBucketQuery (a speculative verify row: the last token and up to 3
// drafts). The n rows are padded to B = decode_bucket(n) rows of q tokens, T = B q token rows
// (request i's tokens at rows i q .. i q + q - 1, padding rows after n q), and run the decode-bucket
// plan of T rows (one CUDA graph per T and path). T must fit the activations (max_tokens) and one
// lm_head pass (logits_rows). Every other step runs as eager passes; the kernels are batch
// invariant, so a token's logits are the same bits either way.
#pragma once
#include <vector>

#include "core/check.h"
#include "runtime/backend.h"

namespace m3::native {

constexpr int kMaxBucketQuery = 4;

// The decode bucket of n sequences: the smallest power of two >= n (n <= max_graph_batch).
inline int decode_bucket(int n) {
  M3_CHECK(n >= 1, "decode bucket: {} sequences", n);
  int b = 1;
  while (b < n) b <<= 1;
  return b;
}

struct BucketLimits {
  int max_graph_batch = 64;  // request rows
  int max_tokens = 2048;     // token rows of a pass
  int logits_rows = 256;     // lm_head rows of a pass
};

// q when the step runs in a bucket (its uniform query length), else 0.
inline int bucket_query_len(const StepBatch& b, const BucketLimits& lim, bool traced) {
  if (traced || b.seqs.empty() || int(b.seqs.size()) > lim.max_graph_batch) return 0;
  const size_t q = b.seqs[0].tokens.size();
  if (q < 1 || q > size_t(kMaxBucketQuery)) return 0;
  for (const SeqStep& s : b.seqs)
    if (s.tokens.size() != q) return 0;
  const int T = decode_bucket(int(b.seqs.size())) * int(q);
  return T <= lim.max_tokens && T <= lim.logits_rows ? int(q) : 0;
}

// A run of consecutive output rows of the step (StepOutput rows: each sequence's last row, or all
// q with all_logits) that sit at consecutive bucket rows.
struct BucketRun {
  int bucket_row = 0, out_row = 0, count = 0;
};

inline std::vector<BucketRun> bucket_output_runs(const StepBatch& b, int q) {
  std::vector<BucketRun> runs;
  int out = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const int n = b.seqs[i].all_logits ? q : 1;
    const int row = int(i) * q + q - n;
    if (!runs.empty() && runs.back().bucket_row + runs.back().count == row)
      runs.back().count += n;
    else
      runs.push_back(BucketRun{row, out, n});
    out += n;
  }
  return runs;
}

}  // namespace m3::native
