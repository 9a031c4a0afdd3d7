// Code points that Hugging Face tokenizers' Oniguruma places in a Unicode general category and
// PCRE2's older tables do not (generated: tools/gen_unicode_delta.py). The ranges are PCRE2 class
// syntax ("\x{31350}-\x{323AF}..."), to splice into a character class after \p{X}.
#pragma once
#include <string>
#include <vector>

namespace m3::text {

struct CategoryDelta {
  const char* category;  // "L", "Lu", ..., "So"
  const char* ranges;
};
const std::vector<CategoryDelta>& unicode_category_deltas();

}  // namespace m3::text
