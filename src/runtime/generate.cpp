// generate (runtime/generate.h).
#include "runtime/generate.h"

#include <algorithm>
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
  const SpeculativeOptions& so = r.speculative;
  if (so.method != SpeculativeMethod::None) validate_speculative(so);
  // EAGLE3: the drafter sees every kept position with the token after it and its aux rows
  Drafter* drafter = so.method == SpeculativeMethod::Eagle3 ? so.drafter.get() : nullptr;
  if (drafter) {
    M3_CHECK(b.returns_aux(), "generate: speculative eagle3 needs the target's auxiliary hidden states, which the {} "
             "backend does not return (the CPU reference and the single-GPU CUDA backend do)", b.name());
    drafter->release(0);
  }
  auto run = [&](SeqStep q) {
    StepBatch batch{{std::move(q)}};
    if (drafter) {
      batch.seqs[0].want_aux = true;
      batch.aux_layers = drafter->aux_layers();
    }
    StepOutput o = b.step(batch);
    ++out.paths[o.path];
    if (!o.fallback_reason.empty()) ++out.fallbacks[o.fallback_reason];
    if (drafter) {
      const size_t w = drafter->aux_layers().size() * size_t(spec.hidden), n = batch.seqs[0].tokens.size();
      M3_CHECK(size_t(o.aux_width) == w && o.aux_first_row.size() == 1 && o.aux_first_row[0] >= 0 &&
                   (size_t(o.aux_first_row[0]) + n) * w <= o.aux.size(),
               "generate: the backend returned aux rows of width {} from row {} ({} floats) for {} tokens; expected "
               "width {}", o.aux_width, o.aux_first_row.empty() ? -1 : o.aux_first_row[0], o.aux.size(), n, w);
    }
    return o;
  };
  auto observe = [&](int32_t start, std::span<const int32_t> next, const StepOutput& o) {
    if (drafter) drafter->observe(0, start, next, o.aux_row(0, 0));
  };
  auto step = [&](int32_t start, std::vector<int32_t> toks) {
    SeqStep q{start, toks, table, false};
    if (r.device_sampling) {
      q.sample = SamplingRequest{r.sampling, st};
      q.want_logits = false;
    }
    const StepOutput o = run(std::move(q));
    int32_t tok;
    if (r.device_sampling && !o.tokens.empty() && o.tokens[0] >= 0) {
      if (r.sampling.temperature != 0) st.draws++;
      tok = int32_t(o.tokens[0]);
    } else {
      tok = int32_t(sample_token(o.row(0), o.vocab, r.sampling, st));
    }
    toks.erase(toks.begin());
    toks.push_back(tok);
    observe(start, toks, o);
    return tok;
  };
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  out.ids.push_back(step(0, r.prompt));
  const auto t1 = clock::now();
  int pos = int(r.prompt.size());
  std::vector<int32_t> seq = r.prompt;  // prompt + new tokens (the n-gram drafts' source)
  seq.push_back(out.ids.back());
  auto stopped = [&] { return r.stop_id >= 0 && out.ids.back() == r.stop_id; };
  while (int(out.ids.size()) < r.max_tokens && !stopped()) {
    std::vector<int32_t> drafts;
    const int room = std::min(so.num_draft_tokens, r.max_tokens - int(out.ids.size()) - 1);
    if (so.method == SpeculativeMethod::Ngram) drafts = ngram_drafts(seq, so.ngram_min, so.ngram_max, room);
    if (drafter) drafts = drafter->propose(0, room);
    if (drafts.empty()) {
      out.ids.push_back(step(pos++, {out.ids.back()}));
      seq.push_back(out.ids.back());
      continue;
    }
    std::vector<int32_t> toks{out.ids.back()};
    toks.insert(toks.end(), drafts.begin(), drafts.end());
    const StepOutput o = run(SeqStep{pos, std::move(toks), table, true});
    M3_CHECK(o.num_rows.size() == 1 && o.num_rows[0] == int(drafts.size()) + 1 &&
                 o.logits.size() >= size_t(o.num_rows[0]) * size_t(o.vocab),
             "generate: the backend returned {} logits rows for a verify step of {} tokens",
             o.num_rows.empty() ? 0 : o.num_rows[0], drafts.size() + 1);
    const VerifyResult v = verify_drafts(o.row(0), o.vocab, drafts, r.sampling, st);
    ++out.verify_steps;
    out.drafted += int(drafts.size());
    out.accepted += v.accepted;
    observe(pos, v.tokens, o);  // positions pos .. pos + accepted, each followed by the next kept token
    pos += 1 + v.accepted;
    for (int32_t t : v.tokens) {
      out.ids.push_back(t);
      seq.push_back(t);
      if (stopped() || int(out.ids.size()) >= r.max_tokens) break;
    }
  }
  if (drafter) drafter->release(0);
  out.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  out.decode_s = std::chrono::duration<double>(clock::now() - t1).count();
  return out;
}

}  // namespace m3
