#include "text/utf8.h"

#include <cstring>

#include "core/check.h"

namespace m3::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// How many bytes starting at s[i] form the longest prefix of some valid UTF-8 character (1..3 when
// incomplete or invalid; the full length when valid), and whether that prefix is a whole character.
struct Prefix {
  size_t len;
  bool complete;
};

Prefix utf8_prefix(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  if (c < 0x80) return {1, true};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {1, false};  // 0x80..0xC1, 0xF5..0xFF: never start a character
  }
  size_t have = 1;
  while (have < need && i + have < s.size()) {
    unsigned char x = b(have);
    bool ok = have == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) break;
    ++have;
  }
  return {have, have == need};
}

}  // namespace

size_t utf8_char_len(std::string_view s, size_t i) {
  Prefix p = utf8_prefix(s, i);
  return p.complete ? p.len : 0;
}

size_t utf8_invalid_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    while (i + 8 <= s.size()) {  // ASCII runs, eight bytes at a time
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = utf8_char_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, std::string_view what) {
  size_t at = utf8_invalid_at(s);
  M3_CHECK(at == std::string_view::npos, "{} is not valid UTF-8 (byte {} of {}: 0x{:02X})", what, at, s.size(),
           static_cast<unsigned>(static_cast<unsigned char>(s[at])));
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
  uint32_t c = b(0);
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xE0) {
    uint32_t cp = ((c & 0x1F) << 6) | (b(1) & 0x3F);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    uint32_t cp = ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    i += 3;
    return cp;
  }
  uint32_t cp = ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  i += 4;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  Utf8Stream s;
  std::string out = s.push(bytes);
  out += s.finish();
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  out.reserve(pending_.size());
  size_t i = 0;
  while (i < pending_.size()) {
    Prefix p = utf8_prefix(pending_, i);
    if (p.complete) {
      out.append(pending_, i, p.len);
    } else if (i + p.len == pending_.size() && static_cast<unsigned char>(pending_[i]) >= 0xC2 &&
               static_cast<unsigned char>(pending_[i]) <= 0xF4) {
      break;  // a valid start of a character that more bytes may complete: hold it back
    } else {
      out += kReplacement;
    }
    i += p.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace m3::text
