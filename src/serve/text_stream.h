// One completion's generated text, token by token: the ids are decoded incrementally
// (text::StreamDecoder, so a UTF-8 character split across tokens is never emitted broken) and
// watched for stop strings. Text that could still be the start of a stop string is held back
// until it can no longer match; when a stop string completes, the text before it is released,
// the stop string itself is dropped and nothing after it is emitted.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace m3::serve {

class TextStream {
 public:
  TextStream(const text::Tokenizer& tok, std::vector<std::string> stop, bool skip_special_tokens);

  // The text this token makes final (may be empty). Call no more after stopped().
  std::string push(int32_t id);
  // Generation ended without a stop string: everything held back.
  std::string finish();

  bool stopped() const { return matched_.has_value(); }
  const std::string& matched_stop() const { return *matched_; }

 private:
  std::string release();  // with held_ updated: what can go out now

  text::StreamDecoder decoder_;
  std::vector<std::string> stop_;
  std::string held_;  // decoded, not yet released
  std::optional<std::string> matched_;
};

// The length of the longest suffix of `text` that is a proper prefix of one of `stops`.
size_t held_back_length(const std::string& text, const std::vector<std::string>& stops);

}  // namespace m3::serve
