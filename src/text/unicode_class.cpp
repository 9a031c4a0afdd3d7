#include "text/unicode_class.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <mutex>
#include <string>

#include "core/check.h"
#include "text/utf8.h"

namespace m3::text {

bool is_white_space(uint32_t cp) {
  // White_Space (stable since Unicode 6.3)
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  static pcre2_code* code = [] {
    const char* pat = "^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                  &err, &off, nullptr);
    M3_CHECK(c, "unicode_class: the word-character pattern does not compile (error {})", err);
    return c;
  }();
  std::string s;
  utf8_append(s, cp);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, PCRE2_NO_UTF_CHECK, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

}  // namespace m3::text
