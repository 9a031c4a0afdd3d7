// generate (runtime/generate.h).
#include "runtime/generate.h"

#include <chrono>
#include <numeric>

#include "core/check.h"

namespace m3 {

int64_t generate_positions(const GenerateRequest& r) { return int64_t(r.prompt.size()) + r.max_tokens - 1; }

GenerateResult generate(Backend& b, const GenerateRequest& r) {
  validate_sampling(r.sampling);
  M3_CHECK(!r.prompt.empty(), "generate: the prompt is empty");
  M3_CHECK(r.max_tokens >= 1, "generate: max_tokens must be >= 1, got {}", r.max_tokens);
  const ModelSpec& spec = b.spec();
  for (size_t i = 0; i < r.prompt.size(); ++i)
    M3_CHECK(r.prompt[i] >= 0 && r.prompt[i] < spec.vocab_size,
             "generate: prompt token {} ({}) is outside the vocabulary [0, {})", i, r.prompt[i], spec.vocab_size);
  const int64_t positions = generate_positions(r);
  const int bs = b.cache_block_size();
  const int64_t blocks = (positions + bs - 1) / bs;
  M3_CHECK(blocks <= b.num_cache_blocks(), "generate: {} prompt tokens + {} new tokens need {} cache blocks of {}, the "
           "backend has {}", r.prompt.size(), r.max_tokens, blocks, bs, b.num_cache_blocks());
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  SamplerState st{r.seed, 0};
  GenerateResult out;
  auto step = [&](int32_t start, std::vector<int32_t> toks) {
    SeqStep q{start, std::move(toks), table, false};
    if (r.device_sampling) {
      q.sample = SamplingRequest{r.sampling, st};
      q.want_logits = false;
    }
    StepOutput o = b.step(StepBatch{{std::move(q)}});
    ++out.paths[o.path];
    if (!o.fallback_reason.empty()) ++out.fallbacks[o.fallback_reason];
    if (r.device_sampling && !o.tokens.empty() && o.tokens[0] >= 0) {
      if (r.sampling.temperature != 0) st.draws++;
      return int32_t(o.tokens[0]);
    }
    return int32_t(sample_token(o.row(0), o.vocab, r.sampling, st));
  };
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  out.ids.push_back(step(0, r.prompt));
  const auto t1 = clock::now();
  int pos = int(r.prompt.size());
  while (int(out.ids.size()) < r.max_tokens && !(r.stop_id >= 0 && out.ids.back() == r.stop_id))
    out.ids.push_back(step(pos++, {out.ids.back()}));
  out.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  out.decode_s = std::chrono::duration<double>(clock::now() - t1).count();
  return out;
}

}  // namespace m3
