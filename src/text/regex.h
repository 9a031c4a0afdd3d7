// The pre-tokenizer's regular expressions, run with PCRE2 (UTF, Unicode properties, look-ahead,
// JIT). Hugging Face tokenizers compiles them with Oniguruma, whose shorthand classes differ from
// PCRE2's: \s is White_Space (PCRE2 adds U+180E), \w is Letter|Mark|Decimal_Number|Connector_
// Punctuation, \h is a hex digit. Patterns are translated so that these mean what Oniguruma means;
// constructs whose meaning would differ and that are not translated (\b, \B, nested or intersected
// classes) are a load error.
// Every match runs under RegexLimits, so that a hostile pattern (tokenizer.json is input too) or a
// hostile text ends in an error naming the limit instead of hanging or exhausting memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::text {

// Bounds on one search (pcre2_match_context). Each is far above what a real pre-tokenizer pattern
// needs on any text: M3's and GPT-2's patterns take a few steps per input byte.
struct RegexLimits {
  uint32_t match = 10'000'000;     // pcre2_set_match_limit: backtracking steps (interpreter and JIT)
  uint32_t depth = 10'000'000;     // pcre2_set_depth_limit: backtracking depth (interpreter)
  uint32_t heap_kib = 64 * 1024;   // pcre2_set_heap_limit: backtracking memory in KiB (interpreter;
                                   // the JIT's stack is capped at kJitStackBytes instead)
  bool jit = true;                 // false: always the interpreter (tests of the depth and heap limits)
};
inline constexpr size_t kJitStackBytes = size_t{16} << 20;

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern; errors start with `what` (the JSON field).
  Regex(const std::string& pattern, const std::string& what, const RegexLimits& limits = {});
  // A pattern that matches `literal` exactly.
  static Regex literal(const std::string& literal, const std::string& what, const RegexLimits& limits = {});
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Every match in s (valid UTF-8), left to right, as Oniguruma's iterator yields them: each search
  // starts where the previous match ended, and an empty match right at the previous match's end is
  // skipped by one character. A search that exceeds a limit is an m3::Error naming the limit, its
  // value, the pattern (and `what`) and the byte offset the search started at.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& source() const { return source_; }
  const std::string& compiled() const { return compiled_; }

 private:
  Regex() = default;
  void compile(const std::string& what);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string source_, compiled_, what_;
  RegexLimits limits_;
};

// The Oniguruma -> PCRE2 translation (exposed for tests).
std::string onig_to_pcre2(const std::string& pattern, const std::string& what);

}  // namespace m3::text
