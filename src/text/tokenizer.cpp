#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/check.h"
#include "text/byte_level.h"

namespace m3::text {
namespace {

using json = nlohmann::json;

bool json_bool(const json& t, const char* key, bool dflt, size_t index) {
  auto it = t.find(key);
  if (it == t.end()) return dflt;
  M3_CHECK(it->is_boolean(), "tokenizer.json: added_tokens[{}].{} must be a boolean", index, key);
  return it->get<bool>();
}

// The decoder: null (tokens joined by spaces), ByteLevel, or a Sequence holding one ByteLevel.
bool parse_decoder(const json& d, const std::string& field) {
  if (d.is_null()) return false;
  M3_CHECK(d.is_object() && d.contains("type") && d["type"].is_string(),
           "tokenizer.json: {} must be null or an object with a \"type\"", field);
  std::string type = d["type"].get<std::string>();
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array() && d["decoders"].size() == 1)
    return parse_decoder(d["decoders"][0], field + ".decoders[0]");
  M3_FAIL("tokenizer.json: {}.type '{}' is not supported (supported: null, ByteLevel)", field, type);
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path, int64_t vocab_size) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = path;
  if (fs::is_directory(p, ec)) p /= "tokenizer.json";
  std::ifstream in(p, std::ios::binary);
  M3_CHECK(in.good(), "tokenizer: cannot open '{}'", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  M3_CHECK(!in.bad(), "tokenizer: error reading '{}'", p.string());
  return from_json_text(ss.str(), vocab_size, p.string());
}

Tokenizer Tokenizer::from_json_text(std::string_view text, int64_t vocab_size, const std::string& origin) {
  M3_CHECK(vocab_size > 0, "tokenizer: vocab_size must be positive, not {}", vocab_size);
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    M3_FAIL("{}: not valid JSON: {}", origin, e.what());
  }
  try {
    M3_CHECK(j.is_object(), "tokenizer.json: the top level must be an object");
    if (auto v = j.find("version"); v != j.end())
      M3_CHECK(v->is_string() && v->get<std::string>() == "1.0", "tokenizer.json: version {} is not \"1.0\"",
               v->dump());
    for (const char* k : {"truncation", "padding"}) {
      auto it = j.find(k);
      M3_CHECK(it == j.end() || it->is_null(), "tokenizer.json: {} is not supported (must be null): {}", k,
               it->dump());
    }
    Tokenizer t;
    t.vocab_size_ = vocab_size;
    auto model = j.find("model");
    M3_CHECK(model != j.end(), "tokenizer.json: model is missing");
    t.model_ = std::make_unique<Bpe>(Bpe::from_json(*model));
    t.normalizer_ = Normalizer::from_json(j.value("normalizer", json()));
    t.pre_ = PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    t.post_ = PostProcessor::from_json(j.value("post_processor", json()));
    t.byte_level_decoder_ = parse_decoder(j.value("decoder", json()), "decoder");

    // Added tokens get their ids as tokenizers gives them (the JSON "id" is not read there): the
    // model's id when the content is in model.vocab, else the next id after model.vocab's size.
    // A JSON id that disagrees would make the two differ, so it is an error.
    std::map<int32_t, AddedToken> by_id;
    int64_t next_id = int64_t(t.model_->size());
    auto at = j.find("added_tokens");
    if (at != j.end() && !at->is_null()) {
      M3_CHECK(at->is_array(), "tokenizer.json: added_tokens must be an array");
      for (size_t i = 0; i < at->size(); ++i) {
        const json& e = (*at)[i];
        M3_CHECK(e.is_object() && e.contains("content") && e["content"].is_string(),
                 "tokenizer.json: added_tokens[{}] has no string \"content\"", i);
        AddedToken a;
        a.content = e["content"].get<std::string>();
        require_utf8(a.content, "tokenizer.json: added_tokens[" + std::to_string(i) + "].content");
        a.special = json_bool(e, "special", false, i);
        a.single_word = json_bool(e, "single_word", false, i);
        a.lstrip = json_bool(e, "lstrip", false, i);
        a.rstrip = json_bool(e, "rstrip", false, i);
        a.normalized = json_bool(e, "normalized", !a.special, i);
        if (a.content.empty()) continue;
        int64_t id;
        if (auto it = t.added_by_content_.find(a.content); it != t.added_by_content_.end()) {
          id = it->second;
        } else if (auto mid = t.model_->token_to_id(a.content)) {
          id = *mid;
        } else {
          id = next_id++;
        }
        M3_CHECK(id <= INT32_MAX, "tokenizer.json: added_tokens[{}] '{}' would get id {}", i, a.content, id);
        a.id = int32_t(id);
        if (auto jid = e.find("id"); jid != e.end()) {
          M3_CHECK(jid->is_number_integer() && jid->get<int64_t>() == id,
                   "tokenizer.json: added_tokens[{}] '{}' says id {}, but tokenizers gives it id {} (model.vocab "
                   "has {} entries; added tokens not in it are numbered from there in file order)",
                   i, a.content, jid->dump(), id, t.model_->size());
        }
        t.added_by_content_[a.content] = a.id;
        if (a.special) t.special_contents_.insert(a.content);
        by_id[a.id] = a;
      }
    }
    for (auto& [id, a] : by_id) {
      t.added_by_id_[id] = t.added_.size();
      t.added_.push_back(a);
    }
    std::vector<std::pair<std::string, int32_t>> raw, normalized;
    for (size_t k = 0; k < t.added_.size(); ++k) {
      const AddedToken& a = t.added_[k];
      if (a.normalized) {
        std::string form = t.normalizer_.empty() ? a.content : t.normalizer_.apply(a.content);
        if (form != a.content) t.added_decoded_[a.id] = form;
        normalized.emplace_back(form, int32_t(k));
      } else {
        raw.emplace_back(a.content, int32_t(k));
      }
    }
    t.raw_matcher_.build(raw);
    t.normalized_matcher_.build(normalized);

    // every id below the model's vocab size
    auto check = [&](const std::string& token, int64_t id, const char* where) {
      M3_CHECK(id >= 0 && id < vocab_size,
               "tokenizer.json: token '{}' ({}) has id {}, which is not below the model's vocab size {}", token,
               where, id, vocab_size);
    };
    for (const auto& [tok, id] : t.model_->vocab()) check(tok, id, "model.vocab");
    for (const auto& a : t.added_) check(a.content, a.id, "added_tokens");
    for (const auto& [name, id] : t.post_.ids()) check(name, id, "post_processor");
    return t;
  } catch (const Error& e) {
    if (origin == "tokenizer.json") throw;
    M3_FAIL("{}: {}", origin, e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  require_utf8(text, "text to encode");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  std::vector<Segment> raw, norm;
  Words words;
  split_added_tokens(text, raw_matcher_, added_, raw);
  for (const Segment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string normalized;
    std::string_view piece = seg.text;
    if (!normalizer_.empty()) {
      normalized = normalizer_.apply(piece);
      piece = normalized;
    }
    norm.clear();
    split_added_tokens(piece, normalized_matcher_, added_, norm);
    for (const Segment& s : norm) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      pre_.run(s.text, words);
      for (std::string_view w : words.words) model_->encode_word(w, ids);
    }
  }
  if (add_special_tokens) post_.apply(ids);
  return ids;
}

void Tokenizer::check_id(int32_t id, size_t pos) const {
  M3_CHECK(id >= 0 && id < vocab_size_, "token id {} (position {}) is outside the vocabulary [0, {})", id, pos,
           vocab_size_);
}

const std::string* Tokenizer::token_string(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    if (auto d = added_decoded_.find(id); d != added_decoded_.end()) return &d->second;
    return &added_[it->second].content;
  }
  return model_->id_to_token(id);
}

void Tokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out, bool& emitted) const {
  const std::string* tok = token_string(id);
  if (!tok) return;
  if (skip_special_tokens && special_contents_.count(*tok)) return;
  if (byte_level_decoder_) {
    byte_level_decode_token(*tok, out);
  } else {
    if (emitted) out += ' ';
    out += *tok;
  }
  emitted = true;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool emitted = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], i);
    append_token_bytes(ids[i], skip_special_tokens, bytes, emitted);
  }
  return byte_level_decoder_ ? utf8_lossy(bytes) : bytes;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = token_string(id);
  if (!s) return std::nullopt;
  return *s;
}

bool Tokenizer::is_special(int32_t id) const {
  const std::string* s = token_string(id);
  return s && special_contents_.count(*s);
}

std::string StreamDecoder::push(int32_t id) {
  M3_CHECK(id >= 0 && id < t_->vocab_size(), "token id {} is outside the vocabulary [0, {})", id, t_->vocab_size());
  std::string bytes;
  t_->append_token_bytes(id, skip_, bytes, emitted_);
  return t_->byte_level_decoder() ? utf8_.push(bytes) : bytes;
}

std::string StreamDecoder::finish() { return t_->byte_level_decoder() ? utf8_.finish() : std::string(); }

}  // namespace m3::text
