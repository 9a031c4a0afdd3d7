#include "text/added_tokens.h"

#include <algorithm>

#include "text/unicode_class.h"
#include "text/utf8.h"

namespace m3::text {
namespace {

// The code point that ends s[0, end) (s valid UTF-8, end > 0).
uint32_t cp_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_next(s, i);
}

}  // namespace

void TokenMatcher::build(const std::vector<std::pair<std::string, int32_t>>& patterns) {
  nodes_.assign(1, Node{});
  first_.fill(false);
  for (const auto& [pat, value] : patterns) {
    if (pat.empty()) continue;
    int n = 0;
    for (char ch : pat) {
      auto c = static_cast<unsigned char>(ch);
      auto& nx = nodes_[size_t(n)].next;
      auto it = std::lower_bound(nx.begin(), nx.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
      if (it != nx.end() && it->first == c) {
        n = it->second;
      } else {
        int fresh = int(nodes_.size());
        nx.insert(it, {c, fresh});
        nodes_.push_back(Node{});
        n = fresh;
      }
    }
    nodes_[size_t(n)].value = value;
    first_[static_cast<unsigned char>(pat[0])] = true;
  }
}

size_t TokenMatcher::longest_at(std::string_view s, size_t i, int32_t& value) const {
  if (!first_[static_cast<unsigned char>(s[i])]) return 0;
  size_t best = 0;
  int n = 0;
  for (size_t k = i; k < s.size(); ++k) {
    const auto& nx = nodes_[size_t(n)].next;
    auto c = static_cast<unsigned char>(s[k]);
    auto it = std::lower_bound(nx.begin(), nx.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it == nx.end() || it->first != c) break;
    n = it->second;
    if (nodes_[size_t(n)].value >= 0) {
      best = k + 1 - i;
      value = nodes_[size_t(n)].value;
    }
  }
  return best;
}

void split_added_tokens(std::string_view s, const TokenMatcher& m, const std::vector<AddedToken>& tokens,
                        std::vector<Segment>& out) {
  if (s.empty()) return;
  if (m.empty()) {
    out.push_back({s, -1});
    return;
  }
  size_t start_offset = 0;  // end of the last emitted segment
  size_t i = 0;
  while (i < s.size()) {
    if (!m.may_start(s[i])) {
      ++i;
      continue;
    }
    int32_t index = -1;
    size_t len = m.longest_at(s, i, index);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // matches never overlap, whatever the checks below decide
    const AddedToken& t = tokens[size_t(index)];
    if (t.single_word) {
      bool word_before = start > 0 && is_word_char(cp_before(s, start));
      size_t j = stop;
      bool word_after = stop < s.size() && is_word_char(utf8_next(s, j));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t k = ns - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_white_space(utf8_next(s, j))) break;
        ns = k;
      }
      start = std::max(ns, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t j = stop;
        if (!is_white_space(utf8_next(s, j))) break;
        stop = j;
      }
    }
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({s.substr(start, stop - start), t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
}

}  // namespace m3::text
