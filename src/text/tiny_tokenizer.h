// The tokenizer.json `m3mono make-tiny` writes next to a synthetic checkpoint: M3's layout (the
// split pattern + ByteLevel, ByteLevel decoder, M3's added tokens) with a byte-level BPE whose
// merges are learned here from a small built-in text, sized to the model's vocabulary: the 256
// byte symbols, the merges, then the added tokens, leaving the last 3 rows without a token as M3
// does (its 200064 rows hold tokens up to 200060). The BOS/EOS ids of config.json are given to
// M3's BOS `]~!b[` and end-of-turn `[e~[` so that the model's stop token decodes as M3's does.
#pragma once
#include <cstdint>
#include <string>

namespace m3::text {

// Smallest vocabulary that holds the bytes, the added tokens and the padding rows.
int64_t tiny_tokenizer_min_vocab();

// The file's text. bos_id/eos_id: config.json's ids (-1: none), each below 259 when given.
std::string tiny_tokenizer_json(int64_t vocab_size, int32_t bos_id, int32_t eos_id);

}  // namespace m3::text
