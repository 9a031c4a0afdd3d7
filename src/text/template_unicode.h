#pragma once
// UTF-8 helpers for the chat-template engine: Python's string model works on code points, so
// length, indexing, slicing, strip and case mapping decode first.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text::tmpl {

// Decodes UTF-8; an invalid byte decodes to itself as U+DC80+byte (like Python's surrogateescape), so
// encode(decode(s)) == s for any byte string.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);

// Python's str.isspace().
bool py_isspace(char32_t c);
// Python's str.isprintable() for one character (approximation: control, format, separator and
// surrogate code points outside ASCII space are non-printable).
bool py_isprintable(char32_t c);
bool py_isalpha(char32_t c);  // letters (ASCII, Latin-1, Latin Extended, Greek, Cyrillic, CJK, ...)
bool py_isdigit(char32_t c);
// Simple case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (others unchanged).
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);
bool py_iscased_upper(char32_t c);
bool py_iscased_lower(char32_t c);

std::string str_upper(std::string_view s);
std::string str_lower(std::string_view s);

// Strips Python whitespace (or, with chars, any of those code points) from the ends.
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars);

}  // namespace m3::text::tmpl
