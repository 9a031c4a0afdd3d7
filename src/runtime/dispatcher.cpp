// Dispatcher: preference-ordered paths, native last and always eligible.
#include "runtime/dispatcher.h"

#include "core/check.h"

namespace m3 {

Dispatcher::Dispatcher() { paths_.push_back(Path{"native", {}}); }

void Dispatcher::add_preferred_path(std::string name, Eligibility eligible) {
  M3_CHECK(!name.empty(), "dispatcher: a path needs a name");
  M3_CHECK(bool(eligible), "dispatcher: path '{}' has no eligibility rule", name);
  for (const auto& p : paths_) M3_CHECK(p.name != name, "dispatcher: path '{}' registered twice", name);
  paths_.insert(paths_.end() - 1, Path{std::move(name), std::move(eligible)});
}

PathChoice Dispatcher::choose(const StepBatch& batch) {
  PathChoice c;
  for (size_t i = 0; i < paths_.size(); ++i) {
    const Path& p = paths_[i];
    std::string reason = p.eligible ? p.eligible(batch) : std::string();
    if (reason.empty()) {
      c.path = int(i);
      c.name = p.name;
      ++steps_[c.name];
      if (!c.fallback_reason.empty()) ++fallbacks_[c.fallback_reason];
      return c;
    }
    if (c.fallback_reason.empty()) c.fallback_reason = p.name + ":" + reason;
  }
  M3_FAIL("dispatcher: no path accepted the batch");  // unreachable: native accepts everything
}

void Dispatcher::count_failure(const std::string& path, const std::string& reason) {
  auto it = steps_.find(path);
  if (it != steps_.end() && it->second > 0) --it->second;
  ++steps_["native"];
  ++fallbacks_[path + ":" + reason];
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
