// DeviceStepMetadata: one device allocation split into the four per-step arrays; upload() copies
// a step's host arrays into it (through one packed host staging vector, one copy).
#include "native/step_metadata.h"

#include "native/cuda_check.h"

namespace m3::native {

DeviceStepMetadata::DeviceStepMetadata(int max_tokens, int max_seqs, int max_table_width)
    : max_tokens_(max_tokens), max_seqs_(max_seqs), max_width_(max_table_width) {
  M3_CHECK(max_tokens > 0 && max_seqs > 0 && max_table_width > 0,
           "step metadata buffers: capacities must be > 0 (tokens {}, seqs {}, table width {})", max_tokens, max_seqs,
           max_table_width);
  size_t n = 3 * size_t(max_tokens) + size_t(max_seqs) * size_t(max_table_width);
  M3_CUDA_CHECK(cudaMalloc(&buf_, n * sizeof(int32_t)));
  // fixed addresses from the start (plans built before the first upload keep them)
  view_.positions = buf_;
  view_.slots = buf_ + max_tokens_;
  view_.token_seq = buf_ + 2 * size_t(max_tokens_);
  view_.block_tables = buf_ + 3 * size_t(max_tokens_);
}

DeviceStepMetadata::~DeviceStepMetadata() { cudaFree(buf_); }

void DeviceStepMetadata::upload(const StepMetadata& m, cudaStream_t stream) {
  M3_CHECK(m.num_tokens <= max_tokens_, "step metadata: {} rows exceed the buffer's {}", m.num_tokens, max_tokens_);
  M3_CHECK(m.num_seqs <= max_seqs_, "step metadata: {} requests exceed the buffer's {}", m.num_seqs, max_seqs_);
  M3_CHECK(m.table_width <= max_width_, "step metadata: table width {} exceeds the buffer's {}", m.table_width,
           max_width_);
  int32_t* pos = buf_;
  int32_t* slots = buf_ + max_tokens_;
  int32_t* seq = buf_ + 2 * size_t(max_tokens_);
  int32_t* tables = buf_ + 3 * size_t(max_tokens_);
  // NOTE: the tables are packed at the step's own width (m.table_width), so view.table_width is
  // the step's; the buffer only bounds it.
  std::vector<int32_t> staging;
  staging.reserve(3 * size_t(max_tokens_) + m.block_tables.size());
  staging.insert(staging.end(), m.positions.begin(), m.positions.end());
  staging.resize(size_t(max_tokens_), -1);
  staging.insert(staging.end(), m.slots.begin(), m.slots.end());
  staging.resize(2 * size_t(max_tokens_), -1);
  staging.insert(staging.end(), m.token_seq.begin(), m.token_seq.end());
  staging.resize(3 * size_t(max_tokens_), -1);
  staging.insert(staging.end(), m.block_tables.begin(), m.block_tables.end());
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `staging` may die here.
  M3_CUDA_CHECK(cudaMemcpyAsync(buf_, staging.data(), staging.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  view_.positions = pos;
  view_.slots = slots;
  view_.token_seq = seq;
  view_.block_tables = tables;
  view_.num_tokens = m.num_tokens;
  view_.table_width = m.table_width;
  view_.max_context = m.max_context;
}

}  // namespace m3::native
