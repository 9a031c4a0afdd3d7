// libFuzzer target: a tokenizer.json (any bytes; seeds: make-tiny's and smaller ones) loaded with
// Tokenizer::from_json_text for a model of 1024 ids, as `serve` and `tokenize` load a checkpoint's.
// Contract:
//  - loading gives a tokenizer or throws m3::Error (which names what is wrong); nothing else
//    escapes;
//  - a loaded tokenizer encodes a fixed text (ASCII, accents, CJK, emoji, digits, runs of spaces,
//    M3's markers) into ids below the vocabulary, with and without special tokens, or throws
//    m3::Error; decodes them (m3::Error only); and incremental decoding equals whole decoding.
// Any broken rule is a __builtin_trap (a crash libFuzzer keeps).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "text/tokenizer.h"

namespace {

constexpr int64_t kVocab = 1024;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

const std::string kText =
    "Hello, world! Grüße aus Köln, 東京 und 😀🚀 — 12345 +   spaces\t\n"
    "]~b]user\n<mm:think>why</mm:think>]<]minimax[>[<tool_call>[e~[";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::optional<m3::text::Tokenizer> tok;
  try {
    tok.emplace(m3::text::Tokenizer::from_json_text(json, kVocab, "fuzzed tokenizer.json"));
  } catch (const m3::Error&) {
    return 0;
  } catch (...) {
    __builtin_trap();
  }
  for (bool add_special : {false, true}) {
    std::vector<int32_t> ids;
    try {
      ids = tok->encode(kText, add_special);
    } catch (const m3::Error&) {
      continue;
    } catch (...) {
      __builtin_trap();
    }
    for (int32_t id : ids) require(id >= 0 && id < kVocab);
    for (bool skip : {false, true}) {
      try {
        const std::string whole = tok->decode(ids, skip);
        m3::text::StreamDecoder d(*tok, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += d.push(id);
        streamed += d.finish();
        require(streamed == whole);
      } catch (const m3::Error&) {
      } catch (...) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
