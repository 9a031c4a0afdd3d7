// Scheduler: planning (budget, admission, preemption), running and post-processing one step.
#include "runtime/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"

namespace m3 {

struct Scheduler::Seq {
  uint64_t id = 0;
  GenerationRequest req;
  EventCallback cb;
  std::vector<int32_t> tokens;  // prompt + generated
  int prompt_len = 0;
  int num_computed = 0;         // tokens whose K/V sit in the cache
  std::vector<int32_t> blocks;  // block table
  SamplerState sampler;
  int preemptions = 0;
  std::vector<int32_t> drafts;  // this step's draft tokens (a verify row), empty otherwise
  bool drafter_off = false;     // the drafter failed on this request: no drafts, no aux rows
  int generated() const { return int(tokens.size()) - prompt_len; }
};

Scheduler::Scheduler(Backend& backend, SchedulerOptions opt)
    : backend_(backend), opt_(opt), blocks_(backend.num_cache_blocks(), backend.cache_block_size()) {
  M3_CHECK(opt_.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got {}", opt_.max_num_seqs);
  M3_CHECK(opt_.max_step_tokens >= 1, "scheduler: max_step_tokens must be >= 1, got {}", opt_.max_step_tokens);
  if (opt_.speculative.method != SpeculativeMethod::None) validate_speculative(opt_.speculative);
  if (opt_.speculative.method == SpeculativeMethod::Eagle3) {
    drafter_ = opt_.speculative.drafter.get();
    M3_CHECK(backend_.returns_aux(),
             "scheduler: speculative eagle3 needs the target's auxiliary hidden states, which the {} backend does not "
             "return (the CPU reference and the single-GPU CUDA backend do)", backend_.name());
  }
  const ModelSpec& sp = spec();
  int64_t capacity = int64_t(blocks_.num_blocks()) * blocks_.block_size();
  int64_t limit = capacity;
  if (sp.max_positions > 0) limit = std::min<int64_t>(limit, sp.max_positions);
  if (opt_.max_model_len > 0) {
    M3_CHECK(opt_.max_model_len <= limit,
             "scheduler: max_model_len {} exceeds what the model and cache allow ({}: max_positions {}, cache {} "
             "blocks x {} tokens)",
             opt_.max_model_len, limit, sp.max_positions, blocks_.num_blocks(), blocks_.block_size());
    limit = opt_.max_model_len;
  }
  M3_CHECK(limit >= 2, "scheduler: max_model_len {} leaves no room for a prompt and one token", limit);
  max_model_len_ = int(std::min<int64_t>(limit, INT32_MAX));
}

Scheduler::~Scheduler() {
  if (drafter_)
    for (const auto& [id, seq] : seqs_) drafter_->release(id);
}

void Scheduler::validate(const GenerationRequest& r) const {
  const int vocab = spec().vocab_size;
  M3_CHECK(!r.prompt.empty(), "request: prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    M3_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab, "request: prompt[{}] = {} is outside the vocabulary [0, {})", i,
             r.prompt[i], vocab);
  M3_CHECK(r.max_tokens >= 1, "request: max_tokens must be >= 1, got {}", r.max_tokens);
  M3_CHECK(int64_t(r.prompt.size()) + r.max_tokens <= max_model_len_,
           "request: prompt ({} tokens) + max_tokens ({}) exceeds the maximum context of {} tokens", r.prompt.size(),
           r.max_tokens, max_model_len_);
  const auto& sp = r.sampling;
  M3_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0, "request: temperature must be >= 0, got {}",
           sp.temperature);
  M3_CHECK(std::isfinite(sp.top_p) && sp.top_p > 0 && sp.top_p <= 1, "request: top_p must be in (0, 1], got {}",
           sp.top_p);
  M3_CHECK(sp.top_k >= 0, "request: top_k must be >= 0, got {}", sp.top_k);
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i)
    M3_CHECK(r.stop_token_ids[i] >= 0 && r.stop_token_ids[i] < vocab,
             "request: stop_token_ids[{}] = {} is outside the vocabulary [0, {})", i, r.stop_token_ids[i], vocab);
  M3_CHECK(r.logprobs >= -1 && r.logprobs <= kMaxLogprobs, "request: logprobs must be -1 (none) or in [0, {}], got {}",
           kMaxLogprobs, r.logprobs);
}

void Scheduler::add(uint64_t id, GenerationRequest r, EventCallback cb) {
  validate(r);
  M3_CHECK(!seqs_.count(id), "scheduler: request id {} is already live", id);
  auto s = std::make_unique<Seq>();
  s->id = id;
  s->tokens = r.prompt;
  s->prompt_len = int(r.prompt.size());
  s->sampler.seed = r.sampling.seed;
  s->req = std::move(r);
  s->cb = std::move(cb);
  waiting_.push_back(s.get());
  seqs_.emplace(id, std::move(s));
}

void Scheduler::remove_from_queues(Seq* s) {
  if (auto it = std::find(running_.begin(), running_.end(), s); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), s); it != waiting_.end()) waiting_.erase(it);
}

void Scheduler::finish(Seq* s, FinishReason r, int32_t stop_token, std::vector<int32_t> new_tokens,
                       std::string error, std::vector<TokenLogprob> logprobs) {
  blocks_.release(s->blocks);
  if (drafter_) drafter_->release(s->id);
  remove_from_queues(s);
  RequestEvent ev;
  ev.id = s->id;
  ev.new_tokens = std::move(new_tokens);
  ev.finished = true;
  ev.reason = r;
  ev.stop_token = stop_token;
  ev.prompt_tokens = s->prompt_len;
  ev.completion_tokens = s->generated();
  ev.preemptions = s->preemptions;
  ev.error = std::move(error);
  ev.logprobs = std::move(logprobs);
  EventCallback cb = std::move(s->cb);
  seqs_.erase(s->id);  // s is gone from here on
  if (cb) cb(ev);
}

bool Scheduler::cancel(uint64_t id, const std::string& why) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  finish(it->second.get(), FinishReason::Cancelled, -1, {}, why);
  return true;
}

void Scheduler::cancel_all(const std::string& why) {
  std::vector<uint64_t> ids;
  for (Seq* s : running_) ids.push_back(s->id);
  for (Seq* s : waiting_) ids.push_back(s->id);
  for (uint64_t id : ids) cancel(id, why);
}

void Scheduler::preempt(Seq* s) {
  // Recompute: drop the cache, keep prompt + generated tokens and the sampler's draw counter, so
  // the request resumes exactly where it was once its sequence is prefilled again.
  blocks_.release(s->blocks);
  if (drafter_) drafter_->release(s->id);  // observed again from position 0 with the recompute
  s->num_computed = 0;
  s->preemptions++;
  remove_from_queues(s);
  waiting_.push_front(s);
}

// Whether `tok` ends the request: the model's eos (unless ignore_eos) or one of its stop ids.
bool Scheduler::stops(const Seq& s, int32_t tok) const {
  const ModelSpec& sp = spec();
  return (!s.req.ignore_eos && sp.eos_id >= 0 && tok == sp.eos_id) ||
         std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), tok) != s.req.stop_token_ids.end();
}

// The drafter sees what the step kept of a sequence that asked for aux rows: positions start ..
// start + kept - 1 and, for each, the token after it (the prompt's, or what was sampled).
// A drafter that fails (a bad draft checkpoint value, out of memory) only costs the request its
// drafts: its state goes, later proposals are empty, and the step's results stand.
void Scheduler::observe(Seq* s, const StepOutput& out, int k, int start, int kept) {
  if (!drafter_ || s->drafter_off || out.aux_first_row.empty() || out.aux_first_row[size_t(k)] < 0 || kept <= 0)
    return;
  try {
    M3_CHECK(int(s->tokens.size()) >= start + kept + 1, "scheduler: request {} has {} tokens, the drafter needs {}",
             s->id, s->tokens.size(), start + kept + 1);
    drafter_->observe(s->id, start, std::span<const int32_t>(s->tokens.data() + start + 1, size_t(kept)),
                      out.aux_row(k, 0));
  } catch (const std::exception& e) {
    drafter_failed(s, e);
  }
}

void Scheduler::drafter_failed(Seq* s, const std::exception& e) {
  drafter_->release(s->id);
  s->drafter_off = true;
  s->drafts.clear();
  ++drafter_failures_;
  last_drafter_error_ = fmt::format("request {}: {}", s->id, e.what());
}

// A verify row's outcome: the kept drafts and the token that ends it, appended one by one under
// the stop rules; the cache keeps the last token and the kept drafts (the rejected drafts' slots
// are overwritten later; blocks past the sequence go back now).
void Scheduler::verified(Seq* s, const StepOutput& out, int k, StepReport& rep) {
  const std::vector<int32_t> drafts = std::move(s->drafts);
  s->drafts.clear();
  const int V = out.vocab;
  const float* rows = out.row(k, 0);
  const VerifyResult v = verify_drafts(rows, V, drafts, s->req.sampling, s->sampler);
  const int start = s->num_computed;
  rep.accepted += v.accepted;
  s->num_computed += 1 + v.accepted;  // the last token and the kept drafts
  std::vector<int32_t> fresh;
  std::vector<TokenLogprob> lps;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t tok = v.tokens[i];
    s->tokens.push_back(tok);
    fresh.push_back(tok);
    rep.generated++;
    if (s->req.logprobs >= 0) lps.push_back(token_logprob(rows + i * size_t(V), V, tok, s->req.logprobs));
    if (stops(*s, tok)) {
      finish(s, FinishReason::Stop, tok, std::move(fresh), "", std::move(lps));
      rep.finished++;
      return;
    }
    if (s->generated() >= s->req.max_tokens || int(s->tokens.size()) >= max_model_len_) {
      finish(s, FinishReason::Length, -1, std::move(fresh), "", std::move(lps));
      rep.finished++;
      return;
    }
  }
  blocks_.shrink(s->blocks, int64_t(s->tokens.size()));
  observe(s, out, k, start, 1 + v.accepted);
  RequestEvent ev;
  ev.id = s->id;
  ev.new_tokens = std::move(fresh);
  ev.logprobs = std::move(lps);
  ev.prompt_tokens = s->prompt_len;
  ev.completion_tokens = s->generated();
  ev.preemptions = s->preemptions;
  if (s->cb) s->cb(ev);
}

StepReport Scheduler::step() {
  StepReport rep;
  StepBatch batch;
  std::vector<Seq*> members;
  int budget = opt_.max_step_tokens;

  auto add_to_batch = [&](Seq* s, int n) {
    SeqStep st;
    st.start_pos = s->num_computed;
    st.tokens.assign(s->tokens.begin() + s->num_computed, s->tokens.begin() + s->num_computed + n);
    const int d = int(s->drafts.size());  // a verify row: the last token, then the drafts
    st.tokens.insert(st.tokens.end(), s->drafts.begin(), s->drafts.end());
    int nb = blocks_.blocks_for(s->num_computed + n + d);
    st.block_table.assign(s->blocks.begin(), s->blocks.begin() + nb);
    if (d > 0) {
      st.all_logits = true;  // each row's logits: the tokens are chosen here (verify_drafts)
      rep.verify_rows++;
      rep.drafted += d;
      budget -= d;
    } else if (opt_.device_sampling && s->req.logprobs < 0) {  // logprobs need the logits: sampled here then
      st.want_logits = false;  // the scheduler reads no logits then (unless the backend samples nothing)
      if (s->num_computed + n == int(s->tokens.size())) st.sample = SamplingRequest{s->req.sampling, s->sampler};
    }
    if (drafter_ && !s->drafter_off && s->req.sampling.temperature == 0) {  // drafts: greedy requests (below)
      st.want_aux = true;
      batch.aux_layers = drafter_->aux_layers();
    }
    batch.seqs.push_back(std::move(st));
    members.push_back(s);
    budget -= n;
    // A decode appends the one token generated last step; everything else (prompt, chunks,
    // recompute after preemption) is prefill.
    bool decode = n == 1 && s->num_computed + 1 == int(s->tokens.size()) && s->num_computed >= s->prompt_len;
    if (!decode) rep.prefill_tokens += n;
  };

  // Drafts for a request that decodes (one token to compute, its prompt done): at most k, within
  // the step's budget left after its token, its max_tokens and the context; only where the cache
  // has their blocks with one block left for each later running request (drafts never preempt).
  const SpeculativeOptions& so = opt_.speculative;
  auto propose = [&](Seq* s, int n, int later) {
    s->drafts.clear();
    // Greedy requests only: how many drafts a request gets depends on the step (budget, free
    // blocks), and with sampling the draws a verify row takes would then depend on the batch; a
    // seeded request's tokens must not (H200 2026-12-04: the GPU soak's sampled cases differed).
    if (so.method == SpeculativeMethod::None || n != 1 || s->num_computed + 1 != int(s->tokens.size()) ||
        s->num_computed < s->prompt_len || s->req.sampling.temperature != 0)
      return;
    const int room = std::min({so.num_draft_tokens, budget - 1, s->req.max_tokens - s->generated() - 1,
                               max_model_len_ - int(s->tokens.size()) - 1});
    if (room <= 0) return;
    if (!drafter_) {
      s->drafts = ngram_drafts(s->tokens, so.ngram_min, so.ngram_max, room);
    } else {
      if (s->drafter_off) return;
      try {
        s->drafts = drafter_->propose(s->id, room);
      } catch (const std::exception& e) {  // as in observe(): no drafts for this request from now on
        drafter_failed(s, e);
      }
    }
    if (s->drafts.empty()) return;
    // a block for each running request after this one stays free (their next token may need it)
    const int64_t len = int64_t(s->num_computed) + 1 + int64_t(s->drafts.size());
    if (blocks_.num_free() - blocks_.blocks_missing(s->blocks, len) < later || !blocks_.ensure(s->blocks, len))
      s->drafts.clear();
  };

  // 1. Running requests, oldest first; preemption victims come from the back.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Seq* s = running_[i];
    int n = std::min(int(s->tokens.size()) - s->num_computed, budget);
    bool self_preempted = false;
    while (!blocks_.ensure(s->blocks, int64_t(s->num_computed) + n)) {
      Seq* victim = running_.back();
      preempt(victim);
      rep.preempted++;
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // s was the newest: nothing after it is left to schedule
    propose(s, n, int(running_.size() - i) - 1);
    add_to_batch(s, n);
    ++i;
  }

  // 2. Admission, only when this step did not have to preempt (the cache is tight).
  while (rep.preempted == 0 && !waiting_.empty() && budget > 0 && int(running_.size()) < opt_.max_num_seqs) {
    Seq* s = waiting_.front();
    int64_t total = int64_t(s->tokens.size());
    if (blocks_.num_free() < blocks_.blocks_for(total + 1)) break;  // head-of-line waits for blocks
    M3_CHECK(blocks_.ensure(s->blocks, total), "scheduler: admission of request {} could not allocate", s->id);
    waiting_.pop_front();
    running_.push_back(s);
    s->drafts.clear();
    add_to_batch(s, std::min<int>(int(total), budget));
  }

  if (batch.seqs.empty()) return rep;
  rep.ran = true;
  rep.num_seqs = int(batch.seqs.size());
  rep.num_tokens = batch.num_tokens();

  // 3. Run.
  StepOutput out;
  auto t0 = std::chrono::steady_clock::now();
  try {
    out = backend_.step(batch);
    rep.path = out.path;
    rep.fallback_reason = out.fallback_reason;
    const int vocab = spec().vocab_size;
    M3_CHECK(out.vocab == vocab, "scheduler: backend returned logits of width {}, expected vocab {}", out.vocab, vocab);
    M3_CHECK(out.first_row.size() == batch.seqs.size() && out.num_rows.size() == batch.seqs.size(),
             "scheduler: backend returned rows for {} sequences, the batch has {}", out.first_row.size(),
             batch.seqs.size());
    if (opt_.device_sampling) {
      M3_CHECK(out.tokens.empty() || out.tokens.size() == batch.seqs.size(),
               "scheduler: backend returned {} sampled tokens, the batch has {} sequences", out.tokens.size(),
               batch.seqs.size());
      for (size_t k = 0; k < batch.seqs.size(); ++k) {
        if (!batch.seqs[k].sample) continue;
        const bool sampled = !out.tokens.empty() && out.tokens[k] >= 0;
        if (sampled) {
          M3_CHECK(out.tokens[k] < vocab, "scheduler: backend sampled token {} for sequence {}, outside [0, {})",
                   out.tokens[k], k, vocab);
        } else {  // sampled here: its last logits row must be there
          M3_CHECK(out.num_rows[k] >= 1 &&
                       size_t(out.first_row[k] + out.num_rows[k]) * size_t(vocab) <= out.logits.size(),
                   "scheduler: backend sampled no token for sequence {} and returned no logits row for it", k);
        }
      }
    } else {
      for (size_t k = 0; k < batch.seqs.size(); ++k)
        M3_CHECK(out.num_rows[k] >= 1 && size_t(out.first_row[k] + out.num_rows[k]) * size_t(vocab) <= out.logits.size(),
                 "scheduler: backend logits rows for sequence {} fall outside its output", k);
    }
    for (size_t k = 0; k < members.size(); ++k)
      if (!members[k]->drafts.empty())
        M3_CHECK(out.num_rows[k] == int(batch.seqs[k].tokens.size()) &&
                     size_t(out.first_row[k] + out.num_rows[k]) * size_t(vocab) <= out.logits.size(),
                 "scheduler: backend returned {} logits rows for the verify row of sequence {} ({} tokens)",
                 out.num_rows[k], k, batch.seqs[k].tokens.size());
    if (!batch.aux_layers.empty()) {
      M3_CHECK(out.aux_width == int(batch.aux_layers.size()) * spec().hidden &&
                   out.aux_first_row.size() == batch.seqs.size(),
               "scheduler: backend returned aux rows of width {} for {} sequences (expected {} for {})", out.aux_width,
               out.aux_first_row.size(), int(batch.aux_layers.size()) * spec().hidden, batch.seqs.size());
      for (size_t k = 0; k < batch.seqs.size(); ++k)
        if (batch.seqs[k].want_aux)
          M3_CHECK(out.aux_first_row[k] >= 0 && (size_t(out.aux_first_row[k]) + batch.seqs[k].tokens.size()) *
                                                        size_t(out.aux_width) <= out.aux.size(),
                   "scheduler: backend returned no aux rows for request {} (batch row {})", members[k]->id, k);
    }
  } catch (const std::exception& e) {
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.error = e.what();
    for (Seq* s : members) finish(s, FinishReason::Error, -1, {}, std::string("backend step failed: ") + e.what());
    rep.finished = int(members.size());
    return rep;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // 4. Sample and apply stop rules.
  for (size_t k = 0; k < members.size(); ++k) {
    Seq* s = members[k];
    if (!s->drafts.empty()) {
      verified(s, out, int(k), rep);
      continue;
    }
    const int start = s->num_computed, n = int(batch.seqs[k].tokens.size());
    s->num_computed += n;
    if (s->num_computed < int(s->tokens.size())) {  // a prefill chunk: no token yet
      observe(s, out, int(k), start, n);
      continue;
    }
    int32_t tok = -1;
    std::vector<TokenLogprob> lps;
    if (opt_.device_sampling && !out.tokens.empty() && out.tokens[k] >= 0) {
      tok = out.tokens[k];  // sampled by the backend with (seed, draws): advance as sample_token does
      if (s->req.sampling.temperature != 0) s->sampler.draws++;
    } else {
      const float* row = out.row(int(k), out.num_rows[k] - 1);
      tok = sample_token(row, out.vocab, s->req.sampling, s->sampler);
      if (s->req.logprobs >= 0) lps.push_back(token_logprob(row, out.vocab, tok, s->req.logprobs));
    }
    s->tokens.push_back(tok);
    rep.generated++;
    if (stops(*s, tok)) {
      finish(s, FinishReason::Stop, tok, {tok}, "", std::move(lps));
      rep.finished++;
    } else if (s->generated() >= s->req.max_tokens || int(s->tokens.size()) >= max_model_len_) {
      finish(s, FinishReason::Length, -1, {tok}, "", std::move(lps));
      rep.finished++;
    } else {
      observe(s, out, int(k), start, n);
      RequestEvent ev;
      ev.id = s->id;
      ev.new_tokens = {tok};
      ev.logprobs = std::move(lps);
      ev.prompt_tokens = s->prompt_len;
      ev.completion_tokens = s->generated();
      ev.preemptions = s->preemptions;
      if (s->cb) s->cb(ev);
    }
  }
  return rep;
}

}  // namespace m3
