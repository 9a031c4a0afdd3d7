// The continuous-batching scheduler, single-threaded (the engine drives it from its own thread;
// tests drive it directly). Each step():
//   1. running requests, oldest first, each get their next chunk: the rest of their prompt (chunked
//      to the step's token budget) or one decode token; when the cache is out of blocks the newest
//      running request is preempted (recompute: its blocks are freed and it goes back to the front
//      of the queue with prompt + generated tokens as its new prompt);
//   2. if nothing was preempted, queued requests are admitted in arrival order while the budget,
//      max_num_seqs and the cache allow (admission control: the whole current sequence plus one
//      token must fit in the free blocks);
//   3. the backend runs the batch (choosing its execution path per step: StepOutput::path), every request whose sequence is
//      fully in the cache samples its next token, and stop rules are applied.
#pragma once
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/backend.h"
#include "runtime/request.h"
#include "runtime/speculative.h"

namespace m3 {

struct SchedulerOptions {
  int max_num_seqs = 16;      // running requests at most (the largest decode batch)
  int max_step_tokens = 512;  // tokens per step: decode tokens + prefill chunks
  int max_model_len = 0;      // prompt + generated tokens; 0 = min(spec.max_positions, cache capacity)
  // Sample on the backend (SeqStep::sample; the CUDA backend's kernel, the CPU reference's
  // sample_token) instead of here, and ask for no logits. Same tokens either way; a backend that
  // returns no token for a request is sampled here from its logits. On by default (verified on an
  // H200, 2026-11-30: GpuSampling.*); off copies every logits row back and samples on the host.
  bool device_sampling = true;
  // Speculative decoding (runtime/speculative.h): a decoding greedy request with drafts runs a
  // verify row of its last token and the drafts (its logits come back; its tokens are chosen here).
  // Sampled requests decode one token a step, so a seeded request's tokens never depend on the
  // batch (the number of drafts would; `generate`, one request, speculates for them too).
  SpeculativeOptions speculative{};
};

// What one step did (the engine turns it into metrics).
struct StepReport {
  bool ran = false;           // false: nothing to do
  int num_seqs = 0;           // sequences in the batch
  int num_tokens = 0;         // tokens in the batch
  int prefill_tokens = 0;     // of which prompt (or recompute) tokens
  int generated = 0;          // tokens sampled
  int preempted = 0;          // requests preempted while planning this step
  int finished = 0;           // requests that finished (any reason) in this step
  int verify_rows = 0;        // requests that ran a verify row (speculative decoding)
  int drafted = 0;            // draft tokens scored
  int accepted = 0;           // of which kept
  std::string path;           // execution path that ran it (StepOutput::path)
  std::string fallback_reason;
  double seconds = 0;         // backend step wall time
  std::string error;          // non-empty when the backend threw (its requests were failed)
};

class Scheduler {
 public:
  Scheduler(Backend& backend, SchedulerOptions opt);
  ~Scheduler();

  // Throws m3::Error naming the bad field when `r` can never run on this engine.
  void validate(const GenerationRequest& r) const;
  // Queues a request (validates first). `id` must be unique among live requests.
  void add(uint64_t id, GenerationRequest r, EventCallback cb);
  // Ends a live request now: frees its blocks, emits its final event (Cancelled). False if unknown.
  bool cancel(uint64_t id, const std::string& why = "cancelled");
  void cancel_all(const std::string& why);

  StepReport step();

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return int(waiting_.size()); }
  int num_running() const { return int(running_.size()); }
  const BlockManager& blocks() const { return blocks_; }
  // Drafter calls that threw (speculative eagle3): those requests went on without drafts.
  int drafter_failures() const { return drafter_failures_; }
  const std::string& last_drafter_error() const { return last_drafter_error_; }
  int max_model_len() const { return max_model_len_; }
  const SchedulerOptions& options() const { return opt_; }
  const ModelSpec& spec() const { return backend_.spec(); }

 private:
  struct Seq;
  void preempt(Seq* s);
  void verified(Seq* s, const StepOutput& out, int k, StepReport& rep);
  void observe(Seq* s, const StepOutput& out, int k, int start, int kept);
  void drafter_failed(Seq* s, const std::exception& e);
  bool stops(const Seq& s, int32_t tok) const;
  void finish(Seq* s, FinishReason r, int32_t stop_token, std::vector<int32_t> new_tokens, std::string error,
              std::vector<TokenLogprob> logprobs = {});
  void remove_from_queues(Seq* s);

  Backend& backend_;
  Drafter* drafter_ = nullptr;  // opt_.speculative.drafter for eagle3
  int drafter_failures_ = 0;     // drafter calls that threw (those requests decode without drafts)
  std::string last_drafter_error_;
  SchedulerOptions opt_;
  int max_model_len_ = 0;
  BlockManager blocks_;
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
  std::deque<Seq*> waiting_;   // arrival order; preempted requests go back to the front
  std::vector<Seq*> running_;  // admission order: oldest first, preemption victims from the back
};

}  // namespace m3
