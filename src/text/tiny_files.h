// The text files a synthetic checkpoint gets beside its weights (make-tiny, the Python module's
// make_tiny): tokenizer.json (byte-level BPE with M3's added tokens, text/tiny_tokenizer.h) and
// chat_template.jinja (M3-style), when the vocabulary is large enough for byte-level BPE.
#pragma once
#include <string>

namespace m3::text {

// Writes them into dir (which exists); returns a note for the user ("; tokenizer.json ..." or why
// none was written). Throws naming the file when one cannot be written.
std::string write_tiny_text_files(const std::string& dir, int vocab_size, int bos_id, int eos_id);

}  // namespace m3::text
