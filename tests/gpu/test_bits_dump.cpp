// Bit-for-bit comparison of two builds (a refactor that must not change an output bit): with
// M3_BITS_DUMP=<file> set, writes every logits row of a fixed scenario to the file, so the files
// of two binaries can be compared with cmp. Fixed seeds (the point is reproducing the same run);
// scenario: the tiny and real-heads synthetic models, FP8 and BF16 caches, five sequences of
// prompt lengths 1 .. 700 prefilled in one chunked step, then 24 greedy decode steps whose batches
// walk 1 .. 5 sequences (buckets 1, 2, 4, 8; graphs captured and replayed), and a mixed step (a
// prefill chunk beside decodes). Uses only the backend's public API, so the same file builds
// against older trees. Skipped without M3_BITS_DUMP. Beside it, <file>.idx says which rows each
// step wrote (preset, cache dtype, step, first row, rows, vocabulary), so scripts/bits-diff.py
// can name the first step whose rows differ (an older tree's file has the same order).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "test_cuda_backend_util.h"

using namespace m3;
using namespace m3::test;

namespace {

int argmax(const float* row, int n) {
  int b = 0;
  for (int i = 1; i < n; ++i)
    if (row[i] > row[b]) b = i;
  return b;
}

}  // namespace

TEST(GpuBitsDump, Write) {
  const char* path = std::getenv("M3_BITS_DUMP");
  if (!path || !*path) GTEST_SKIP() << "M3_BITS_DUMP not set";
  FILE* f = std::fopen(path, "wb");
  ASSERT_NE(f, nullptr) << path;
  FILE* idx = std::fopen((std::string(path) + ".idx").c_str(), "w");
  ASSERT_NE(idx, nullptr) << path << ".idx";
  uint64_t rows_written = 0;
  for (const char* preset : {"tiny", "real-heads"}) {
    const ModelSpec spec = synthetic_preset(preset);
    SyntheticOptions so;
    so.seed = 20261201;
    const PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
    const int V = spec.vocab_size, bs = spec.index_block;
    for (DType kv : {DType::F8_E4M3, DType::BF16}) {
      native::CudaBackendOptions o;
      const int per_seq = (1024 + bs - 1) / bs;
      o.num_cache_blocks = 5 * per_seq + 4;
      o.kv_dtype = o.ik_dtype = kv;
      o.max_tokens = 512;  // the prefill step runs in several passes
      o.max_graph_batch = 8;
      auto be = native::make_cuda_backend(m.pw, o);
      const int lens[5] = {1, 37, 130, 300, 700};
      std::vector<std::vector<int32_t>> tables(5), toks(5);
      StepBatch pre;
      for (int s = 0; s < 5; ++s) {
        for (int b = 0; b < per_seq; ++b) tables[size_t(s)].push_back(int32_t(s * per_seq + (b * 7 + s) % per_seq));
        for (int t = 0; t < lens[s]; ++t) toks[size_t(s)].push_back(int32_t((t * 131 + s * 17 + 3) % V));
        SeqStep q;
        q.start_pos = 0;
        q.tokens = toks[size_t(s)];
        q.block_table = tables[size_t(s)];
        q.all_logits = s == 2;
        pre.seqs.push_back(q);
      }
      int step_no = 0;  // 0 the prefill, 1 .. 24 the decodes, 25 the mixed step
      auto dump = [&](const StepOutput& out) {
        ASSERT_EQ(std::fwrite(out.logits.data(), 4, out.logits.size(), f), out.logits.size());
        std::fprintf(idx, "%s %s %d %llu %zu %d\n", preset, kv == DType::BF16 ? "bf16" : "fp8", step_no++,
                     (unsigned long long)rows_written, out.logits.size() / size_t(V), V);
        rows_written += out.logits.size() / size_t(V);
      };
      auto next = [&](const StepOutput& out, const StepBatch& b) {
        for (size_t i = 0; i < b.seqs.size(); ++i) {
          const int r = out.first_row[i] + out.num_rows[i] - 1;
          toks[i].push_back(
              int32_t(argmax(out.logits.data() + size_t(r) * V, V)));
        }
      };
      StepOutput out = be->step(pre);
      dump(out);
      next(out, pre);
      for (int step = 0; step < 24; ++step) {
        StepBatch d;
        const int n = 1 + step % 5;
        for (int s = 0; s < n; ++s) {
          SeqStep q;
          q.start_pos = int32_t(toks[size_t(s)].size()) - 1;
          q.tokens = {toks[size_t(s)].back()};
          q.block_table = tables[size_t(s)];
          d.seqs.push_back(q);
        }
        out = be->step(d);
        dump(out);
        for (int s = 0; s < n; ++s) {
          const int r = out.first_row[size_t(s)];
          toks[size_t(s)].push_back(int32_t(argmax(out.logits.data() + size_t(r) * V, V)));
        }
      }
      // mixed: sequence 4 appends 40 tokens beside single-token decodes of 0 .. 3
      StepBatch mix;
      for (int s = 0; s < 5; ++s) {
        SeqStep q;
        q.start_pos = int32_t(toks[size_t(s)].size()) - 1;
        q.tokens = {toks[size_t(s)].back()};
        if (s == 4)
          for (int t = 0; t < 39; ++t) q.tokens.push_back(int32_t((t * 29 + 5) % V));
        q.block_table = tables[size_t(s)];
        q.all_logits = s == 4;
        mix.seqs.push_back(q);
      }
      dump(be->step(mix));
    }
  }
  std::fclose(f);
  std::fclose(idx);
  std::printf("BITS | %llu logits rows written to %s\n", (unsigned long long)rows_written, path);
}
