// A Hugging Face tokenizer.json run exactly as the `tokenizers` library runs it, for the layouts
// byte-level BPE checkpoints use (MiniMax-M3, GPT-2/4o-style): added tokens split out first
// (added_tokens.h), the normalizer (normalize.h), the pre-tokenizer (pretokenize.h), the BPE model
// (bpe.h), the post-processor (post_process.h); decoding through the ByteLevel decoder (or none),
// also incrementally (StreamDecoder). A feature outside this set is a load error naming the JSON
// field, and every id must be below the model's vocab size.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/normalize.h"
#include "text/post_process.h"
#include "text/pretokenize.h"
#include "text/utf8.h"

namespace m3::text {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one. Every id (vocab, added tokens,
  // post-processor) must be below `vocab_size` (the model's embedding rows).
  static Tokenizer load(const std::string& path, int64_t vocab_size);
  // From the file's text; `origin` names it in errors.
  static Tokenizer from_json_text(std::string_view json_text, int64_t vocab_size,
                                  const std::string& origin = "tokenizer.json");

  // `text` must be valid UTF-8 (else an error naming the byte offset). add_special_tokens applies
  // the post-processor (tokenizers' default: true).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Ids at or past vocab_size (or negative) are an error naming the position; ids below it with no
  // token (padding rows) decode to nothing, as in tokenizers.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  int64_t vocab_size() const { return vocab_size_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  size_t model_vocab_entries() const { return model_->size(); }

  // The decoder's bytes for one id ("" when skipped or unknown); false when the decoder is not
  // byte-level (then the text is the tokens joined with spaces).
  bool byte_level_decoder() const { return byte_level_decoder_; }
  void append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out, bool& emitted) const;

  Bpe& model_for_test() { return *model_; }

 private:
  Tokenizer() = default;
  void check_id(int32_t id, size_t pos) const;
  const std::string* token_string(int32_t id) const;

  int64_t vocab_size_ = 0;
  std::unique_ptr<Bpe> model_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  PostProcessor post_;
  bool byte_level_decoder_ = false;
  std::vector<AddedToken> added_;                           // by id
  std::unordered_map<int32_t, size_t> added_by_id_;         // id -> index in added_
  std::unordered_map<int32_t, std::string> added_decoded_;  // id -> normalized content (decode form)
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_set<std::string> special_contents_;
  TokenMatcher raw_matcher_, normalized_matcher_;
};

// Incremental decoding: push() returns the text that the ids so far make final; a UTF-8 character
// split across tokens is held back until complete. The concatenation of every push() and finish()
// equals Tokenizer::decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& t, bool skip_special_tokens = false) : t_(&t), skip_(skip_special_tokens) {}
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer* t_;
  bool skip_;
  bool emitted_ = false;
  Utf8Stream utf8_;
};

}  // namespace m3::text
