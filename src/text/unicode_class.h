// The two character classes Hugging Face's added-token matching uses (through Rust's regex crate):
// \s = White_Space and \w = Alphabetic | Mark | Decimal_Number | Connector_Punctuation |
// Join_Control (UTS #18 Annex C).
#pragma once
#include <cstdint>

namespace m3::text {

bool is_white_space(uint32_t cp);
bool is_word_char(uint32_t cp);

}  // namespace m3::text
