// Incremental decoding with stop strings held back across tokens.
#include "serve/text_stream.h"

#include <algorithm>

namespace m3::serve {

TextStream::TextStream(const text::Tokenizer& tok, std::vector<std::string> stop, bool skip_special_tokens)
    : decoder_(tok, skip_special_tokens), stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

size_t held_back_length(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const auto& s : stops) {
    const size_t most = std::min(text.size(), s.size() - 1);
    for (size_t n = most; n > best; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        best = n;
        break;
      }
  }
  return best;
}

std::string TextStream::release() {
  // the earliest match wins (ties: the longer stop string)
  size_t at = std::string::npos, len = 0;
  for (const auto& s : stop_) {
    size_t p = held_.find(s);
    if (p != std::string::npos && (p < at || (p == at && s.size() > len))) {
      at = p;
      len = s.size();
      matched_ = s;
    }
  }
  if (at != std::string::npos) {
    std::string out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  const size_t keep = held_back_length(held_, stop_);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped()) return {};
  held_ += decoder_.push(id);
  return release();
}

std::string TextStream::finish() {
  if (stopped()) return {};
  held_ += decoder_.finish();
  std::string out = release();
  if (!stopped()) {
    out += held_;
    held_.clear();
  }
  return out;
}

}  // namespace m3::serve
