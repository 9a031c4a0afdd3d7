// libFuzzer target: the tokenizer `m3mono make-tiny` writes (M3's split pattern + ByteLevel, M3's
// added tokens, a learned byte-level BPE) on arbitrary bytes. Contract:
//  - ill-formed UTF-8 is an m3::Error from encode, and only ill-formed UTF-8 is;
//  - on valid UTF-8: every id is below the vocabulary size, decode(encode(text)) == text (added
//    tokens included: the tiny tokenizer has no normalizer and keeps special tokens when asked),
//    and incremental decoding (StreamDecoder) equals whole decoding;
//  - the input read as little-endian 16-bit ids: in-range ids decode (with and without special
//    tokens) to valid UTF-8, the stream decoder agrees and never emits ill-formed UTF-8; an
//    out-of-range id is an m3::Error.
// Nothing else may escape; any broken rule is a __builtin_trap.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

constexpr int64_t kVocab = 1024;

const m3::text::Tokenizer& tokenizer() {
  static const m3::text::Tokenizer t =
      m3::text::Tokenizer::from_json_text(m3::text::tiny_tokenizer_json(kVocab, 1, 2), kVocab, "tiny tokenizer.json");
  return t;
}

void require(bool ok) {
  if (!ok) __builtin_trap();
}

bool valid_utf8(std::string_view s) { return m3::text::utf8_invalid_at(s) == std::string_view::npos; }

std::string stream_decode(const m3::text::Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  m3::text::StreamDecoder d(t, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    require(valid_utf8(piece));
    out += piece;
  }
  std::string rest = d.finish();
  out += rest;
  return out;
}

void check_text(const m3::text::Tokenizer& t, std::string_view text) {
  const bool valid = valid_utf8(text);
  std::vector<int32_t> ids;
  try {
    ids = t.encode(text, /*add_special_tokens=*/false);
  } catch (const m3::Error&) {
    require(!valid);  // only ill-formed UTF-8 is refused
    return;
  }
  require(valid);
  for (int32_t id : ids) require(id >= 0 && id < kVocab);
  const std::string back = t.decode(ids, /*skip_special_tokens=*/false);
  require(back == text);
  require(stream_decode(t, ids, false) == back);
  // with the post-processor: the same ids plus the special ones around them
  std::vector<int32_t> with = t.encode(text, /*add_special_tokens=*/true);
  require(with.size() >= ids.size());
  for (int32_t id : with) require(id >= 0 && id < kVocab);
}

void check_ids(const m3::text::Tokenizer& t, const uint8_t* data, size_t size) {
  std::vector<int32_t> ids;
  bool in_range = true;
  for (size_t i = 0; i + 1 < size; i += 2) {
    int32_t id = int32_t(data[i] | (data[i + 1] << 8));
    if (id >= kVocab) in_range = false;
    ids.push_back(id);
  }
  for (bool skip : {false, true}) {
    std::string whole;
    try {
      whole = t.decode(ids, skip);
    } catch (const m3::Error&) {
      require(!in_range);
      continue;
    }
    require(in_range && valid_utf8(whole));
    require(stream_decode(t, ids, skip) == whole);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const m3::text::Tokenizer& t = tokenizer();
  try {
    check_text(t, std::string_view(reinterpret_cast<const char*>(data), size));
    check_ids(t, data, size);
  } catch (...) {
    __builtin_trap();  // an exception the contract does not allow
  }
  return 0;
}
