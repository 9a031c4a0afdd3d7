// UTF-8 helpers for the tokenizer: validation (errors name the byte offset), code point iteration,
// and lossy decoding with the Unicode "maximal subpart" rule (one U+FFFD per maximal invalid
// subsequence; the rule Rust's String::from_utf8_lossy and so Hugging Face tokenizers follow), in
// a streaming form that holds back a trailing incomplete character.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::text {

// Length of the valid UTF-8 character starting at s[i], or 0 when the bytes there are not one.
size_t utf8_char_len(std::string_view s, size_t i);

// The byte offset of the first invalid byte, or npos when s is valid UTF-8.
size_t utf8_invalid_at(std::string_view s);

// Throws m3::Error naming `what` and the byte offset when s is not valid UTF-8.
void require_utf8(std::string_view s, std::string_view what);

// Decodes the code point at s[i] (s valid UTF-8); advances i.
uint32_t utf8_next(std::string_view s, size_t& i);

// Appends code point cp (a Unicode scalar value) as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

// Lossy conversion of arbitrary bytes to valid UTF-8.
std::string utf8_lossy(std::string_view bytes);

// Streaming lossy conversion: push() appends bytes and returns the text that is final (a trailing
// prefix of a valid character is held back); finish() returns the rest (a held-back prefix becomes
// one U+FFFD). The concatenation of all outputs equals utf8_lossy of all bytes pushed.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace m3::text
