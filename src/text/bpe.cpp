#include "text/bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>

#include "core/check.h"
#include "text/utf8.h"

namespace m3::text {
namespace {

using json = nlohmann::json;

constexpr size_t kCacheWords = 10000;
constexpr size_t kCacheMaxBytes = 256;

std::string optional_string(const json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return {};
  M3_CHECK(it->is_string(), "tokenizer.json: model.{} must be a string or null", key);
  return it->get<std::string>();
}

bool optional_bool(const json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return false;
  M3_CHECK(it->is_boolean(), "tokenizer.json: model.{} must be a boolean or null", key);
  return it->get<bool>();
}

}  // namespace

Bpe::Bpe(Bpe&& o) noexcept
    : vocab_(std::move(o.vocab_)), vocab_r_(std::move(o.vocab_r_)), merges_(std::move(o.merges_)),
      merge_keys_(std::move(o.merge_keys_)), char_id_(std::move(o.char_id_)), unk_id_(o.unk_id_),
      fuse_unk_(o.fuse_unk_), ignore_merges_(o.ignore_merges_), prefix_(std::move(o.prefix_)),
      suffix_(std::move(o.suffix_)), cache_(std::move(o.cache_)) {}

Bpe::~Bpe() = default;

Bpe Bpe::from_json(const json& m) {
  M3_CHECK(m.is_object(), "tokenizer.json: model must be an object");
  auto type = m.find("type");
  if (type != m.end()) {
    M3_CHECK(type->is_string() && type->get<std::string>() == "BPE",
             "tokenizer.json: model.type {} is not supported (only BPE)", type->dump());
  }
  Bpe b;
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null()) {
    M3_CHECK(d->is_number() && d->get<double>() == 0.0,
             "tokenizer.json: model.dropout {} is not supported (only null or 0)", d->dump());
  }
  M3_CHECK(!optional_bool(m, "byte_fallback"), "tokenizer.json: model.byte_fallback true is not supported");
  b.fuse_unk_ = optional_bool(m, "fuse_unk");
  b.ignore_merges_ = optional_bool(m, "ignore_merges");
  b.prefix_ = optional_string(m, "continuing_subword_prefix");
  b.suffix_ = optional_string(m, "end_of_word_suffix");

  auto v = m.find("vocab");
  M3_CHECK(v != m.end() && v->is_object(), "tokenizer.json: model.vocab is missing or not an object");
  b.vocab_.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    M3_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                 it.value().get<int64_t>() <= INT32_MAX,
             "tokenizer.json: model.vocab entry '{}' has id {}, not a non-negative 32-bit integer", it.key(),
             it.value().dump());
    int32_t id = it.value().get<int32_t>();
    b.vocab_[it.key()] = id;
    b.vocab_r_.emplace(id, it.key());  // NOTE: with duplicate ids the first spelling decodes
  }
  if (auto u = optional_string(m, "unk_token"); !u.empty()) {
    auto it = b.vocab_.find(u);
    M3_CHECK(it != b.vocab_.end(), "tokenizer.json: model.unk_token '{}' is not in model.vocab", u);
    b.unk_id_ = it->second;
  }

  auto mg = m.find("merges");
  M3_CHECK(mg != m.end() && mg->is_array(), "tokenizer.json: model.merges is missing or not an array");
  b.merges_.reserve(mg->size());
  b.merge_keys_.reserve(mg->size());
  uint32_t rank = 0;
  for (size_t i = 0; i < mg->size(); ++i) {
    const json& e = (*mg)[i];
    std::string a, c;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;  // as tokenizers skips it
      size_t sp = s.find(' ');
      M3_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               "tokenizer.json: model.merges[{}] '{}' is not two tokens separated by one space", i, s);
      a = s.substr(0, sp);
      c = s.substr(sp + 1);
    } else {
      M3_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
               "tokenizer.json: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]: {}", i, e.dump());
      a = e[0].get<std::string>();
      c = e[1].get<std::string>();
    }
    auto ia = b.vocab_.find(a), ic = b.vocab_.find(c);
    M3_CHECK(ia != b.vocab_.end(), "tokenizer.json: model.merges[{}]: token '{}' is not in model.vocab", i, a);
    M3_CHECK(ic != b.vocab_.end(), "tokenizer.json: model.merges[{}]: token '{}' is not in model.vocab", i, c);
    M3_CHECK(c.size() >= b.prefix_.size(), "tokenizer.json: model.merges[{}]: '{}' is shorter than the prefix", i, c);
    std::string merged = a + c.substr(b.prefix_.size());
    auto im = b.vocab_.find(merged);
    M3_CHECK(im != b.vocab_.end(), "tokenizer.json: model.merges[{}]: the merged token '{}' is not in model.vocab", i,
             merged);
    uint64_t key = pair_key(ia->second, ic->second);
    b.merges_[key] = MergeTo{rank, im->second};  // a repeated pair keeps its last rank, as in tokenizers
    b.merge_keys_.push_back(key);
    ++rank;
  }
  if (b.prefix_.empty() && b.suffix_.empty()) {
    b.char_id_.assign(0x10000, -1);
    for (const auto& [tok, id] : b.vocab_) {
      size_t n = tok.empty() ? 0 : utf8_char_len(tok, 0);
      if (n == tok.size() && n > 0) {
        size_t j = 0;
        uint32_t cp = utf8_next(tok, j);
        if (cp < 0x10000) b.char_id_[cp] = id;
      }
    }
  }
  return b;
}

void Bpe::disable_merge_for_test(size_t rank) {
  M3_CHECK(rank < merge_keys_.size(), "disable_merge_for_test: rank {} >= {}", rank, merge_keys_.size());
  auto it = merges_.find(merge_keys_[rank]);
  if (it != merges_.end() && it->second.rank == rank) merges_.erase(it);
  std::lock_guard<std::mutex> lk(cache_mu_);
  cache_.clear();
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() < kCacheMaxBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cache_.size() < kCacheWords) cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + long(start), out.end()));
  }
}

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id) { syms.push_back(Sym{id, int(syms.size()) - 1, int(syms.size()) + 1, true}); };

  // 1. characters -> ids (unknown ones become unk, fused when fuse_unk; dropped without unk_token)
  int32_t pending_unk = -1;  // an unknown run not yet added
  size_t i = 0;
  while (i < w.size()) {
    size_t n = utf8_char_len(w, i);
    if (n == 0) n = 1;  // (words are valid UTF-8; be safe)
    bool first = i == 0, last = i + n == w.size();
    int32_t id = -1;
    if (!char_id_.empty()) {
      size_t j = i;
      uint32_t cp = utf8_next(w, j);
      if (cp < 0x10000) {
        id = char_id_[cp];
      } else {
        auto it = vocab_.find(w.substr(i, n));
        if (it != vocab_.end()) id = it->second;
      }
    } else {
      std::string s;
      if (!first) s += prefix_;
      s.append(w.substr(i, n));
      if (last) s += suffix_;
      auto it = vocab_.find(s);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(id);
    } else if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    i += n;
  }
  if (pending_unk >= 0) add(pending_unk);
  if (syms.empty()) return;
  syms.back().next = -1;

  // 2. merges, lowest rank first, then leftmost
  struct Cand {
    uint32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto lookup = [&](int32_t a, int32_t b) -> const MergeTo* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (const MergeTo* m = lookup(syms[k].id, syms[k + 1].id)) q.push(Cand{m->rank, int(k), m->id});
  while (!q.empty()) {
    Cand top = q.top();
    q.pop();
    Sym& s = syms[size_t(top.pos)];
    if (!s.alive || s.next < 0) continue;
    Sym& r = syms[size_t(s.next)];
    const MergeTo* cur = lookup(s.id, r.id);
    if (!cur || cur->id != top.id) continue;  // stale entry
    s.id = top.id;
    r.alive = false;
    s.next = r.next;
    if (s.next >= 0) syms[size_t(s.next)].prev = top.pos;
    if (s.prev >= 0)
      if (const MergeTo* m = lookup(syms[size_t(s.prev)].id, s.id)) q.push(Cand{m->rank, s.prev, m->id});
    if (s.next >= 0)
      if (const MergeTo* m = lookup(s.id, syms[size_t(s.next)].id)) q.push(Cand{m->rank, top.pos, m->id});
  }
  for (const Sym& s : syms)
    if (s.alive) out.push_back(s.id);
}

}  // namespace m3::text
