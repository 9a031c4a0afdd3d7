// The pre-tokenizer of a tokenizer.json: Split (a Regex or String pattern; behavior Removed,
// Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern, then the byte-level alphabet), and Sequence of these, applied to
// each piece in turn as tokenizers does. Any other type is a load error naming the field.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace m3::text {

// GPT-2's split pattern, which ByteLevel uses when use_regex is true.
extern const char* const kGpt2Pattern;

// The words of one run: views into the input text or into `buf` (when a step rewrote them).
struct Words {
  std::vector<std::string_view> words;
  std::string buf, scratch;
  std::vector<std::string_view> tmp;
  std::vector<std::pair<size_t, size_t>> spans;
};

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& field = "pre_tokenizer");
  // Splits text (valid UTF-8, alive while `out` is used) into the words the model encodes.
  void run(std::string_view text, Words& out) const;
  bool byte_level() const;  // some step maps to the byte-level alphabet

 private:
  enum class Kind { Split, ByteLevel };
  enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  struct Step {
    Kind kind;
    std::vector<Regex> regex;  // 0 or 1 (Regex is move-only)
    Behavior behavior = Behavior::Isolated;
    bool invert = false, add_prefix_space = false, use_regex = true;
  };
  void add(const nlohmann::json& j, const std::string& field);
  static void split(const Step& st, std::string_view s, std::vector<std::string_view>& out);
  std::vector<Step> steps_;
};

}  // namespace m3::text
