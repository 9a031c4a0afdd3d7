// Dispatcher: preference-ordered paths, native last and always eligible.
#include "runtime/dispatcher.h"

#include "core/check.h"

namespace m3 {

Dispatcher::Dispatcher(std::unique_ptr<Backend> native) : native_(std::move(native)) {
  M3_CHECK(native_ != nullptr, "dispatcher: the native backend is null");
  paths_.push_back(Path{"native", native_.get(), {}});
}

void Dispatcher::add_preferred_path(std::string name, Backend* backend, Eligibility eligible) {
  M3_CHECK(backend != nullptr, "dispatcher: path '{}' has a null backend", name);
  M3_CHECK(bool(eligible), "dispatcher: path '{}' has no eligibility rule", name);
  M3_CHECK(backend->cache_block_size() == native_->cache_block_size() &&
               backend->num_cache_blocks() == native_->num_cache_blocks(),
           "dispatcher: path '{}' cache ({} blocks of {}) differs from native ({} blocks of {})", name,
           backend->num_cache_blocks(), backend->cache_block_size(), native_->num_cache_blocks(),
           native_->cache_block_size());
  for (const auto& p : paths_) M3_CHECK(p.name != name, "dispatcher: path '{}' registered twice", name);
  paths_.insert(paths_.end() - 1, Path{std::move(name), backend, std::move(eligible)});
}

PathChoice Dispatcher::choose(const StepBatch& batch) const {
  PathChoice c;
  for (size_t i = 0; i < paths_.size(); ++i) {
    const Path& p = paths_[i];
    std::string reason = p.eligible ? p.eligible(batch) : std::string();
    if (reason.empty()) {
      c.path = int(i);
      c.name = p.name;
      return c;
    }
    if (c.fallback_reason.empty()) c.fallback_reason = p.name + ":" + reason;
  }
  M3_FAIL("dispatcher: no path accepted the batch");  // unreachable: native accepts everything
}

StepOutput Dispatcher::run(const PathChoice& choice, const StepBatch& batch, SelectionTrace* trace) {
  M3_CHECK(choice.path >= 0 && size_t(choice.path) < paths_.size(), "dispatcher: path index {} out of range",
           choice.path);
  return paths_[size_t(choice.path)].backend->step(batch, trace);
}

std::vector<std::string> Dispatcher::path_names() const {
  std::vector<std::string> n;
  for (const auto& p : paths_) n.push_back(p.name);
  return n;
}

std::string mono_batch_refusal(const StepBatch& batch, int max_rows) {
  for (const auto& s : batch.seqs)
    if (s.tokens.size() != 1) return "prefill";
  if (int(batch.seqs.size()) > max_rows) return "batch_too_large";
  return "";
}

}  // namespace m3
