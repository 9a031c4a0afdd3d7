// Scheduler: planning (budget, admission, preemption), running and post-processing one step.
#include "runtime/scheduler.h"

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
  int generated() const { return int(tokens.size()) - prompt_len; }
};

Scheduler::Scheduler(Backend& backend, SchedulerOptions opt)
    : backend_(backend), opt_(opt), blocks_(backend.num_cache_blocks(), backend.cache_block_size()) {
  M3_CHECK(opt_.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got {}", opt_.max_num_seqs);
  M3_CHECK(opt_.max_step_tokens >= 1, "scheduler: max_step_tokens must be >= 1, got {}", opt_.max_step_tokens);
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

Scheduler::~Scheduler() = default;

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
  s->num_computed = 0;
  s->preemptions++;
  remove_from_queues(s);
  waiting_.push_front(s);
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
    int nb = blocks_.blocks_for(s->num_computed + n);
    st.block_table.assign(s->blocks.begin(), s->blocks.begin() + nb);
    if (opt_.device_sampling && s->req.logprobs < 0) {  // logprobs need the logits: sampled here then
      st.want_logits = false;  // the scheduler reads no logits then (unless the backend samples nothing)
      if (s->num_computed + n == int(s->tokens.size())) st.sample = SamplingRequest{s->req.sampling, s->sampler};
    }
    batch.seqs.push_back(std::move(st));
    members.push_back(s);
    budget -= n;
    // A decode appends the one token generated last step; everything else (prompt, chunks,
    // recompute after preemption) is prefill.
    bool decode = n == 1 && s->num_computed + 1 == int(s->tokens.size()) && s->num_computed >= s->prompt_len;
    if (!decode) rep.prefill_tokens += n;
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
  } catch (const std::exception& e) {
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.error = e.what();
    for (Seq* s : members) finish(s, FinishReason::Error, -1, {}, std::string("backend step failed: ") + e.what());
    rep.finished = int(members.size());
    return rep;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // 4. Sample and apply stop rules.
  const ModelSpec& sp = spec();
  for (size_t k = 0; k < members.size(); ++k) {
    Seq* s = members[k];
    s->num_computed += int(batch.seqs[k].tokens.size());
    if (s->num_computed < int(s->tokens.size())) continue;  // a prefill chunk: no token yet
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
    bool is_stop = (!s->req.ignore_eos && sp.eos_id >= 0 && tok == sp.eos_id) ||
                   std::find(s->req.stop_token_ids.begin(), s->req.stop_token_ids.end(), tok) !=
                       s->req.stop_token_ids.end();
    if (is_stop) {
      finish(s, FinishReason::Stop, tok, {tok}, "", std::move(lps));
      rep.finished++;
    } else if (s->generated() >= s->req.max_tokens || int(s->tokens.size()) >= max_model_len_) {
      finish(s, FinishReason::Length, -1, {tok}, "", std::move(lps));
      rep.finished++;
    } else {
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
