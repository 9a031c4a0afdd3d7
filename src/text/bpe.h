// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): vocab, merges in
// either spelling ("a b" strings or ["a", "b"] pairs), unk_token/fuse_unk, continuing_subword_
// prefix, end_of_word_suffix, ignore_merges. A word is split into characters, then the pair of
// lowest merge rank (leftmost on ties) is merged until none applies, exactly as tokenizers'
// Word::merge_all does (including its check that a queued merge is still current). Words are
// cached (the result is the same with or without the cache).
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3::text {

// Hash for string maps that are looked up by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // Parses the "model" object; errors name the field ("model.merges[12]", ...).
  static Bpe from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when no token has that id
  size_t size() const { return vocab_.size(); }      // number of vocab entries (HF's vocab size)
  const StringMap<int32_t>& vocab() const { return vocab_; }

  // Tests: drop the merge of rank `rank` (to prove the exactness tests can fail).
  void disable_merge_for_test(size_t rank);

  Bpe(Bpe&& o) noexcept;
  Bpe& operator=(Bpe&&) = delete;
  ~Bpe();

 private:
  Bpe() = default;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  struct MergeTo {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  StringMap<int32_t> vocab_;
  std::unordered_map<int32_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, MergeTo> merges_;
  std::vector<uint64_t> merge_keys_;    // by rank
  std::vector<int32_t> char_id_;        // code point < 0x10000 -> id (-1 none), when no prefix/suffix
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;

  // word -> ids; bounded like tokenizers' (10 000 words of under 256 bytes)
  mutable std::mutex cache_mu_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace m3::text
