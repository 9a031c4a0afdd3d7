#include "text/tiny_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/check.h"
#include "text/byte_level.h"
#include "text/m3_tokens.h"
#include "text/pretokenize.h"
#include "text/utf8.h"

namespace m3::text {
namespace {

using json = nlohmann::json;

constexpr int kPaddingRows = 3;

// The text the merges are learned from: English, code, digits and M3's chat layout words.
const char* const kTrainingText = R"(The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
You are a helpful assistant. The user asks a question and the assistant answers it.
Hello! How are you today? I'm fine, thank you. What can I do for you? Let's think step by step.
I think the answer is forty-two. They'll be here soon; we've waited long enough, haven't we?
Please write a short story about a robot that learns to paint. Once upon a time there was a robot.
The robot lived in a small town near the sea. Every morning it walked to the beach and watched the waves.
system user ai tool developer assistant response function call arguments name value result error
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 42 100 256 1000 2024 3.14 65536 1,000,000.
def main():
    for i in range(10):
        print("hello", i)
    return 0

int main(int argc, char** argv) {
    std::vector<int> values = {1, 2, 3};
    for (int v : values) printf("%d\n", v);
    return 0;
}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
<invoke name="search"><query>weather in Paris</query></invoke>
The weather in Paris is sunny with a high of twenty degrees. It will rain tomorrow in the evening.
Bonjour le monde. Hola mundo. Hallo Welt. Ciao mondo. Привет мир. 你好，世界。こんにちは世界。
Machine learning models read text as tokens. A tokenizer splits the text into pieces and maps every piece
to a number. Large language models predict the next token from the previous ones, one step at a time.
Attention lets every position look at the positions before it; the cache keeps their keys and values.
Experts in a mixture of experts layer each handle some of the tokens, and a router chooses which ones.
Questions, answers, explanations, summaries, translations, calculations, conversations, instructions.
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
August September October November December morning afternoon evening night yesterday tomorrow
import json, os, sys
from typing import Optional, List, Dict
class Request:
    def __init__(self, prompt: str, max_tokens: int = 16) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
if __name__ == "__main__":
    sys.exit(main())
const auto result = std::make_unique<Engine>(config);
template <typename T> struct Buffer { T* data; size_t size; };
SELECT name, value FROM settings WHERE id = 7 ORDER BY name;
https://example.com/path/to/page?query=value&other=1
Water boils at one hundred degrees and freezes at zero. The earth goes around the sun once a year.
Children play in the garden while their parents prepare dinner in the kitchen and talk about work.
Scientists measure, compare, and publish; engineers design, build, and test; writers draft and revise.
)";

struct Trainer {
  std::vector<std::string> tok;  // symbol strings (byte-level)
  std::unordered_map<std::string, int> id_of;
  std::vector<std::pair<std::vector<int>, int>> words;  // symbols, count

  int symbol(const std::string& s) {
    auto [it, fresh] = id_of.emplace(s, int(tok.size()));
    if (fresh) tok.push_back(s);
    return it->second;
  }

  // One merge: the most frequent adjacent pair whose concatenation is new (ties: the smallest
  // pair of strings). Returns false when no pair is left.
  bool step(std::vector<std::pair<std::string, std::string>>& merges) {
    std::map<std::pair<int, int>, int> counts;
    for (const auto& [w, c] : words)
      for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += c;
    const std::pair<const std::pair<int, int>, int>* best = nullptr;
    for (const auto& e : counts) {
      if (id_of.count(tok[size_t(e.first.first)] + tok[size_t(e.first.second)])) continue;
      if (!best || e.second > best->second ||
          (e.second == best->second &&
           std::make_pair(tok[size_t(e.first.first)], tok[size_t(e.first.second)]) <
               std::make_pair(tok[size_t(best->first.first)], tok[size_t(best->first.second)])))
        best = &e;
    }
    if (!best) return false;
    auto [a, b] = best->first;
    int merged = symbol(tok[size_t(a)] + tok[size_t(b)]);
    merges.emplace_back(tok[size_t(a)], tok[size_t(b)]);
    for (auto& [w, c] : words) {
      std::vector<int> out;
      out.reserve(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = std::move(out);
    }
    return true;
  }
};

json pre_tokenizer_json() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"}, {"pattern", {{"Regex", kM3SplitPattern}}}, {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                         {"use_regex", false}}})}};
}

}  // namespace

int64_t tiny_tokenizer_min_vocab() { return 256 + int64_t(m3_added_tokens().size()) + kPaddingRows; }

std::string tiny_tokenizer_json(int64_t vocab_size, int32_t bos_id, int32_t eos_id) {
  const auto& added = m3_added_tokens();
  M3_CHECK(vocab_size >= tiny_tokenizer_min_vocab(),
           "tiny tokenizer: a vocabulary of {} rows cannot hold a byte-level BPE (256 byte symbols) and M3's {} "
           "added tokens; it needs at least {}", vocab_size, added.size(), tiny_tokenizer_min_vocab());
  M3_CHECK(bos_id < 259 && eos_id < 259 && (bos_id < 0 || bos_id != eos_id),
           "tiny tokenizer: bos_id {} / eos_id {} must be distinct and below 259", bos_id, eos_id);
  // ids 0..258 (less bos/eos): the byte symbols in byte order
  std::map<int32_t, std::string> model_vocab;  // id -> token
  int32_t next = 0;
  auto skip_reserved = [&] {
    while (next == bos_id || next == eos_id) ++next;
  };
  for (int b = 0; b < 256; ++b) {
    skip_reserved();
    std::string s;
    utf8_append(s, byte_level_char(uint8_t(b)));
    model_vocab[next++] = s;
  }
  if (bos_id >= 0) model_vocab[bos_id] = "]~!b[";
  if (eos_id >= 0) model_vocab[eos_id] = "[e~[";
  int32_t first_free = 0;
  while (model_vocab.count(first_free)) ++first_free;
  M3_CHECK(first_free == int32_t(model_vocab.size()), "tiny tokenizer: ids below {} are not all used", first_free);

  // merges learned from the built-in text
  PreTokenizer pre = PreTokenizer::from_json(pre_tokenizer_json());
  Words w;
  pre.run(kTrainingText, w);
  Trainer tr;
  for (const auto& [id, s] : model_vocab) tr.symbol(s);
  std::map<std::string, int> counts;
  for (std::string_view word : w.words) ++counts[std::string(word)];
  for (const auto& [word, c] : counts) {
    std::vector<int> syms;
    for (size_t i = 0; i < word.size();) {
      size_t n = utf8_char_len(word, i);
      syms.push_back(tr.symbol(word.substr(i, n)));
      i += n;
    }
    tr.words.emplace_back(std::move(syms), c);
  }
  size_t n_reserved_added = size_t(bos_id >= 0) + size_t(eos_id >= 0);
  int64_t merge_budget = vocab_size - kPaddingRows - int64_t(added.size() - n_reserved_added) - int64_t(model_vocab.size());
  std::vector<std::pair<std::string, std::string>> merges;
  while (int64_t(merges.size()) < merge_budget && tr.step(merges)) {
  }
  json vocab = json::object();
  for (const auto& [id, s] : model_vocab) vocab[s] = id;
  int32_t id = int32_t(model_vocab.size());
  for (const auto& [a, b] : merges) vocab[a + b] = id++;

  json added_json = json::array();
  for (const auto& t : added) {
    int32_t tid;
    if (vocab.contains(t.content)) tid = vocab[t.content].get<int32_t>();
    else tid = id++;
    added_json.push_back({{"id", tid}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", t.special}});
  }
  M3_CHECK(id <= vocab_size - kPaddingRows, "tiny tokenizer: {} ids exceed the vocabulary {}", id, vocab_size);

  json merges_json = json::array();
  for (const auto& [a, b] : merges) merges_json.push_back(json::array({a, b}));
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added_json},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre_tokenizer_json()},
            {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
                                {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                       {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges_json}}}};
  return j.dump(1);
}

}  // namespace m3::text
