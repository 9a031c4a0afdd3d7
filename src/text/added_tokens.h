// Added tokens (tokenizer.json "added_tokens"): found in the text before the pre-tokenizer runs,
// leftmost first and longest at a position, as tokenizers' AddedVocabulary does: tokens with
// normalized=false in the raw text, then tokens with normalized=true in each remaining piece after
// the normalizer; single_word keeps a match only when no word character touches it; lstrip/rstrip
// take the white space to its left/right into the token.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

// A piece of text: an added token (id >= 0) or text still to be tokenized (id < 0).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

// A set of literal strings matched leftmost-longest.
class TokenMatcher {
 public:
  // (pattern, value) pairs; empty patterns are ignored.
  void build(const std::vector<std::pair<std::string, int32_t>>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  bool may_start(char c) const { return first_[static_cast<unsigned char>(c)]; }
  // The longest pattern that starts at s[i]: its length (0 when none) and value.
  size_t longest_at(std::string_view s, size_t i, int32_t& value) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
    int32_t value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
};

// Splits `s` at the matches of `m` (tokens[value] holds the flags), appending the segments.
void split_added_tokens(std::string_view s, const TokenMatcher& m, const std::vector<AddedToken>& tokens,
                        std::vector<Segment>& out);

}  // namespace m3::text
