// The pre-tokenizer's regular expressions, run with PCRE2 (UTF, Unicode properties, look-ahead,
// JIT). Hugging Face tokenizers compiles them with Oniguruma, whose shorthand classes differ from
// PCRE2's: \s is White_Space (PCRE2 adds U+180E), \w is Letter|Mark|Decimal_Number|Connector_
// Punctuation, \h is a hex digit. Patterns are translated so that these mean what Oniguruma means;
// constructs whose meaning would differ and that are not translated (\b, \B, nested or intersected
// classes) are a load error.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::text {

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern; errors start with `what` (the JSON field).
  Regex(const std::string& pattern, const std::string& what);
  // A pattern that matches `literal` exactly.
  static Regex literal(const std::string& literal, const std::string& what);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Every match in s (valid UTF-8), left to right, as Oniguruma's iterator yields them: each search
  // starts where the previous match ended, and an empty match right at the previous match's end is
  // skipped by one character.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& source() const { return source_; }
  const std::string& compiled() const { return compiled_; }

 private:
  Regex() = default;
  void compile(const std::string& what);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string source_, compiled_;
};

// The Oniguruma -> PCRE2 translation (exposed for tests).
std::string onig_to_pcre2(const std::string& pattern, const std::string& what);

}  // namespace m3::text
