#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace m3::text {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_char{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 512> to_byte{};  // indexed by code point (all mapped code points are < 0x144)
  Tables() {
    to_byte.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) to_char[size_t(b)] = printable(b) ? uint32_t(b) : next++;
    for (int b = 0; b < 256; ++b) {
      utf8_append(to_utf8[size_t(b)], to_char[size_t(b)]);
      to_byte[to_char[size_t(b)]] = int16_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_level_char(uint8_t b) { return tables().to_char[b]; }

int byte_level_byte(uint32_t cp) { return cp < 512 ? tables().to_byte[cp] : -1; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& t = tables();
  size_t at = out.size();
  out.resize(at + bytes.size() * 2);
  char* d = out.data() + at;
  for (char c : bytes) {
    const std::string& u = t.to_utf8[static_cast<unsigned char>(c)];
    d[0] = u[0];
    if (u.size() == 2) d[1] = u[1];
    d += u.size();
  }
  out.resize(size_t(d - out.data()));
}

void byte_level_decode_token(std::string_view token, std::string& out) {
  size_t start = out.size();
  size_t i = 0;
  while (i < token.size()) {
    size_t n = utf8_char_len(token, i);
    int b = n ? byte_level_byte([&] { size_t j = i; return utf8_next(token, j); }()) : -1;
    if (b < 0) {  // a character outside the alphabet: the token's own bytes
      out.resize(start);
      out.append(token);
      return;
    }
    out += char(b);
    i += n;
  }
}

}  // namespace m3::text
