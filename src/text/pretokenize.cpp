#include "text/pretokenize.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/byte_level.h"

namespace m3::text {

const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

const Regex& gpt2_regex() {
  static const Regex r(kGpt2Pattern, "ByteLevel's GPT-2 pattern");
  return r;
}

bool get_bool(const nlohmann::json& j, const char* key, bool dflt, const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  M3_CHECK(it->is_boolean(), "tokenizer.json: {}.{} must be a boolean", field, key);
  return it->get<bool>();
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& field) {
  PreTokenizer p;
  if (!j.is_null()) p.add(j, field);
  return p;
}

void PreTokenizer::add(const nlohmann::json& j, const std::string& field) {
  M3_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
           "tokenizer.json: {} must be null or an object with a \"type\"", field);
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    M3_CHECK(it != j.end() && it->is_array(), "tokenizer.json: {}.pretokenizers must be an array", field);
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], field + ".pretokenizers[" + std::to_string(i) + "]");
  } else if (type == "ByteLevel") {
    Step st{Kind::ByteLevel, {}};
    st.add_prefix_space = get_bool(j, "add_prefix_space", true, field);
    st.use_regex = get_bool(j, "use_regex", true, field);
    steps_.push_back(std::move(st));
  } else if (type == "Split") {
    Step st{Kind::Split, {}};
    auto pat = j.find("pattern");
    M3_CHECK(pat != j.end() && pat->is_object() && pat->size() == 1,
             "tokenizer.json: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", field);
    if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
      st.regex.emplace_back((*pat)["Regex"].get<std::string>(), "tokenizer.json: " + field + ".pattern.Regex");
    } else if (pat->contains("String") && (*pat)["String"].is_string()) {
      st.regex.push_back(Regex::literal((*pat)["String"].get<std::string>(), "tokenizer.json: " + field + ".pattern.String"));
    } else {
      M3_FAIL("tokenizer.json: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}, not {}", field, pat->dump());
    }
    auto b = j.find("behavior");
    M3_CHECK(b != j.end() && b->is_string(), "tokenizer.json: {}.behavior must be a string", field);
    std::string bs = b->get<std::string>();
    if (bs == "Removed") st.behavior = Behavior::Removed;
    else if (bs == "Isolated") st.behavior = Behavior::Isolated;
    else if (bs == "MergedWithPrevious") st.behavior = Behavior::MergedWithPrevious;
    else if (bs == "MergedWithNext") st.behavior = Behavior::MergedWithNext;
    else if (bs == "Contiguous") st.behavior = Behavior::Contiguous;
    else M3_FAIL("tokenizer.json: {}.behavior '{}' is not a split behavior", field, bs);
    st.invert = get_bool(j, "invert", false, field);
    steps_.push_back(std::move(st));
  } else {
    M3_FAIL("tokenizer.json: {}.type '{}' is not supported (supported: null, Split, ByteLevel, Sequence)", field, type);
  }
}

bool PreTokenizer::byte_level() const {
  for (const auto& s : steps_)
    if (s.kind == Kind::ByteLevel) return true;
  return false;
}

void PreTokenizer::split(const Step& st, std::string_view s, std::vector<std::string_view>& out) {
  struct Span {
    size_t a, b;
    bool match;
  };
  thread_local std::vector<std::pair<size_t, size_t>> found;
  thread_local std::vector<Span> spans;
  const Regex& re = st.kind == Kind::Split ? st.regex[0] : gpt2_regex();
  re.find_all(s, found);
  spans.clear();
  size_t prev = 0;
  for (auto [a, b] : found) {
    if (prev != a) spans.push_back({prev, a, false});
    spans.push_back({a, b, true});
    prev = b;
  }
  if (prev != s.size()) spans.push_back({prev, s.size(), false});
  if (st.invert)
    for (auto& sp : spans) sp.match = !sp.match;

  auto emit = [&](size_t a, size_t b) {
    if (b > a) out.push_back(s.substr(a, b - a));
  };
  switch (st.kind == Kind::Split ? st.behavior : Behavior::Isolated) {
    case Behavior::Isolated:
      for (const auto& sp : spans) emit(sp.a, sp.b);
      break;
    case Behavior::Removed:
      for (const auto& sp : spans)
        if (!sp.match) emit(sp.a, sp.b);
      break;
    case Behavior::Contiguous:
    case Behavior::MergedWithPrevious: {
      // Contiguous: a span of the same kind as the previous joins it; MergedWithPrevious: a match
      // following a non-match joins it.
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const auto& sp : spans) {
        bool join = st.behavior == Behavior::Contiguous ? sp.match == prev_match : (sp.match && !prev_match);
        if (join && !acc.empty()) acc.back().second = sp.b;
        else acc.emplace_back(sp.a, sp.b);
        prev_match = sp.match;
      }
      for (auto [a, b] : acc) emit(a, b);
      break;
    }
    case Behavior::MergedWithNext: {
      std::vector<std::pair<size_t, size_t>> acc;  // built right to left
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !acc.empty()) acc.back().first = it->a;
        else acc.emplace_back(it->a, it->b);
        prev_match = it->match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first, it->second);
      break;
    }
  }
}

void PreTokenizer::run(std::string_view text, Words& w) const {
  w.words.clear();
  if (text.empty()) return;
  w.words.push_back(text);
  for (const Step& st : steps_) {
    w.tmp.clear();
    if (st.kind == Kind::Split) {
      for (std::string_view p : w.words) split(st, p, w.tmp);
      std::swap(w.words, w.tmp);
      continue;
    }
    // ByteLevel: rewritten words go to a fresh buffer (the old words may point into w.buf)
    std::string nb;
    size_t total = 0;
    for (std::string_view p : w.words) total += p.size() + 1;
    nb.reserve(total * 2);
    w.spans.clear();
    for (std::string_view p : w.words) {
      std::string_view q = p;
      if (st.add_prefix_space && p[0] != ' ') {
        w.scratch.assign(1, ' ');
        w.scratch.append(p);
        q = w.scratch;
      }
      size_t first = w.tmp.size();
      if (st.use_regex) split(st, q, w.tmp);
      else w.tmp.push_back(q);
      for (size_t k = first; k < w.tmp.size(); ++k) {
        size_t at = nb.size();
        byte_level_encode(w.tmp[k], nb);
        w.spans.emplace_back(at, nb.size() - at);
      }
      w.tmp.resize(first);
    }
    w.buf = std::move(nb);
    w.words.clear();
    for (auto [at, n] : w.spans) w.words.emplace_back(w.buf.data() + at, n);
  }
}

}  // namespace m3::text
