// The GPT-2 byte-level alphabet that Hugging Face's ByteLevel pre-tokenizer and decoder use: every
// byte maps to one printable code point (bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF map to themselves,
// the other 68 to U+0100.. in byte order), so any byte string becomes a string of 256 symbols.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::text {

// The code point byte b maps to.
uint32_t byte_level_char(uint8_t b);

// The byte code point cp stands for, or -1 when cp is not in the alphabet.
int byte_level_byte(uint32_t cp);

// Appends the byte-level form of `bytes` (each byte as its code point, UTF-8 encoded).
void byte_level_encode(std::string_view bytes, std::string& out);

// The decoder's view of one token: its bytes when every character is in the alphabet, else the
// token's own UTF-8 bytes unchanged (as the ByteLevel decoder does for, e.g., added tokens with
// spaces).
void byte_level_decode_token(std::string_view token, std::string& out);

}  // namespace m3::text
