// write_tiny_text_files (text/tiny_files.h).
#include "text/tiny_files.h"

#include <fmt/format.h>

#include <fstream>

#include "core/check.h"
#include "text/tiny_chat_template.h"
#include "text/tiny_tokenizer.h"

namespace m3::text {

std::string write_tiny_text_files(const std::string& dir, int vocab_size, int bos_id, int eos_id) {
  if (vocab_size < tiny_tokenizer_min_vocab())
    return fmt::format("; no tokenizer.json (vocab {} < {} needed for byte-level BPE)", vocab_size,
                       tiny_tokenizer_min_vocab());
  const std::string path = dir + "/tokenizer.json";
  std::ofstream f(path, std::ios::binary);
  f << tiny_tokenizer_json(vocab_size, bos_id, eos_id);
  M3_CHECK(f.good(), "make-tiny: cannot write '{}'", path);
  const std::string tpath = dir + "/chat_template.jinja";
  std::ofstream t(tpath, std::ios::binary);
  t << tiny_chat_template();
  M3_CHECK(t.good(), "make-tiny: cannot write '{}'", tpath);
  return "; tokenizer.json (byte-level BPE, M3's added tokens) and chat_template.jinja (M3-style)";
}

}  // namespace m3::text
