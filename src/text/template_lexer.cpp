#include "text/template_lexer.h"

#include <algorithm>

#include "text/template_error.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {
namespace {

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& o) : s_(std::move(src)), o_(o) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit(Token::Type::Data, s_.substr(pos), pos);
        break;
      }
      char kind = s_[tag + 1];
      char sign = tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+') ? s_[tag + 2] : 0;
      std::string text = s_.substr(pos, tag - pos);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && o_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_ws(text, l_pos)) text.resize(l_pos);
      }
      if (!text.empty()) emit(Token::Type::Data, text, pos);
      size_t body = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = end_comment(tag, body, line_starting);
      } else if (kind == '%' && raw_begin(body, pos)) {
        pos = raw_body(tag, pos, line_starting);
      } else {
        emit(kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin, s_.substr(tag, body - tag), tag);
        pos = lex_tag(body, kind == '{', line_starting);
      }
    }
    emit(Token::Type::Eof, "", s_.size());
    return std::move(out_);
  }

 private:
  std::string s_;
  LexOptions o_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;

  [[noreturn]] void fail(size_t at, const std::string& msg, TemplateError::Kind k = TemplateError::Kind::Syntax) {
    auto [l, c] = position(at);
    throw TemplateError(k, l, c, msg);
  }

  std::pair<int, int> position(size_t at) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(at - line_starts_[line - 1] + 1)};
  }

  void emit(Token::Type t, std::string v, size_t at) {
    auto [l, c] = position(at);
    out_.push_back(Token{t, std::move(v), l, c});
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = s_.find('{', pos); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Python whitespace at byte i (ASCII or a multi-byte space); returns its byte length or 0.
  size_t ws_at(std::string_view t, size_t i) const {
    unsigned char c = static_cast<unsigned char>(t[i]);
    if (c < 0x80) return py_isspace(c) ? 1 : 0;
    size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (i + n > t.size()) return 0;
    std::u32string u = utf8_decode(t.substr(i, n));
    return u.size() == 1 && py_isspace(u[0]) ? n : 0;
  }

  bool all_ws(std::string_view t, size_t from) const {
    for (size_t i = from; i < t.size();) {
      size_t n = ws_at(t, i);
      if (!n) return false;
      i += n;
    }
    return true;
  }

  static std::string rstrip_ws(const std::string& t) { return py_strip(t, false, true, nullptr); }

  size_t skip_ws(size_t i) const {
    while (i < s_.size()) {
      size_t n = ws_at(s_, i);
      if (!n) break;
      i += n;
    }
    return i;
  }

  bool starts(size_t i, std::string_view p) const { return s_.compare(i, p.size(), p) == 0; }

  // After `-%}`: all whitespace; after `%}` with trim_blocks: one newline; `+%}`: nothing.
  size_t after_block_end(size_t i, char sign, bool& line_starting) {
    if (sign == '-') i = skip_ws(i);
    else if (sign != '+' && o_.trim_blocks && i < s_.size() && s_[i] == '\n') ++i;
    line_starting = i > 0 && s_[i - 1] == '\n';
    return i;
  }

  size_t end_comment(size_t tag, size_t body, bool& line_starting) {
    size_t q = s_.find("#}", body);
    if (q == std::string::npos) fail(tag, "missing end of comment tag");
    char sign = q > body && (s_[q - 1] == '-' || s_[q - 1] == '+') ? s_[q - 1] : 0;
    return after_block_end(q + 2, sign, line_starting);
  }

  bool name_at(size_t i, std::string_view word) const {
    if (!starts(i, word)) return false;
    size_t e = i + word.size();
    return e >= s_.size() || !(isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_');
  }

  // `{% raw %}`: sets *end past the opening tag when this is one.
  bool raw_begin(size_t body, size_t& end) {
    size_t i = skip_ws(body);
    if (!name_at(i, "raw")) return false;
    i = skip_ws(i + 3);
    if (starts(i, "-%}")) { end = skip_ws(i + 3); return true; }
    if (starts(i, "%}")) { end = i + 2; return true; }
    return false;
  }

  size_t raw_body(size_t tag, size_t from, bool& line_starting) {
    for (size_t i = s_.find("{%", from); i != std::string::npos; i = s_.find("{%", i + 1)) {
      char sign = i + 2 < s_.size() && (s_[i + 2] == '-' || s_[i + 2] == '+') ? s_[i + 2] : 0;
      size_t j = skip_ws(i + 2 + (sign ? 1 : 0));
      if (!name_at(j, "endraw")) continue;
      j = skip_ws(j + 6);
      char esign = 0;
      if (starts(j, "-%}") || starts(j, "+%}")) esign = s_[j++];
      if (!starts(j, "%}")) continue;
      std::string text = s_.substr(from, i - from);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && o_.lstrip_blocks) {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 && l_pos < text.size() && all_ws(text, l_pos)) text.resize(l_pos);
      }
      if (!text.empty()) emit(Token::Type::Data, text, from);
      return after_block_end(j + 2, esign, line_starting);
    }
    fail(tag, "missing end of raw directive");
  }

  size_t lex_tag(size_t i, bool variable, bool& line_starting) {
    std::vector<char> balance;
    size_t open = i;
    while (true) {
      i = skip_ws(i);
      if (i >= s_.size()) fail(open, variable ? "unexpected end of template: '}}' expected" : "unexpected end of template: '%}' expected");
      if (balance.empty()) {
        if (variable) {
          if (starts(i, "-}}")) { emit(Token::Type::VarEnd, "-}}", i); return after_block_end(i + 3, '-', line_starting); }
          if (starts(i, "}}")) { emit(Token::Type::VarEnd, "}}", i); line_starting = false; return i + 2; }
        } else {
          for (char sg : {'+', '-'}) {
            if (s_[i] == sg && starts(i + 1, "%}")) {
              emit(Token::Type::BlockEnd, s_.substr(i, 3), i);
              return after_block_end(i + 3, sg, line_starting);
            }
          }
          if (starts(i, "%}")) { emit(Token::Type::BlockEnd, "%}", i); return after_block_end(i + 2, 0, line_starting); }
        }
      }
      i = lex_one(i, balance);
    }
  }

  size_t lex_number(size_t i) {
    size_t start = i;
    auto digits = [&](size_t& k, auto pred) {
      // (\d+_)*\d+ style runs: digits with single underscores between them
      size_t b = k;
      while (k < s_.size() && (pred(s_[k]) || (s_[k] == '_' && k > b && k + 1 < s_.size() && pred(s_[k + 1])))) ++k;
      return k > b;
    };
    auto dec = [](char c) { return c >= '0' && c <= '9'; };
    bool after_dot = start > 0 && s_[start - 1] == '.';
    // float: digits ( (.digits)? e[+-]?digits | .digits )
    if (!after_dot) {
      size_t k = i;
      digits(k, dec);
      size_t f = k;
      bool frac = false;
      if (f < s_.size() && s_[f] == '.' && f + 1 < s_.size() && dec(s_[f + 1])) {
        ++f;
        digits(f, dec);
        frac = true;
      }
      size_t e = f;
      bool exp = false;
      if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
        size_t x = e + 1;
        if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
        if (x < s_.size() && dec(s_[x])) {
          digits(x, dec);
          e = x;
          exp = true;
        }
      }
      if (frac || exp) {
        std::string v;
        for (size_t t = i; t < e; ++t) if (s_[t] != '_') v.push_back(s_[t]);
        emit(Token::Type::Float, v, start);
        return e;
      }
    }
    // integer: 0b / 0o / 0x / decimal
    char p = i + 1 < s_.size() ? static_cast<char>(tolower(static_cast<unsigned char>(s_[i + 1]))) : 0;
    if (s_[i] == '0' && (p == 'b' || p == 'o' || p == 'x')) {
      auto pred = p == 'b' ? +[](char c) { return c == '0' || c == '1'; }
                : p == 'o' ? +[](char c) { return c >= '0' && c <= '7'; }
                           : +[](char c) { return isxdigit(static_cast<unsigned char>(c)) != 0; };
      size_t k = i + 2;
      if (k < s_.size() && s_[k] == '_') ++k;
      size_t b = k;
      if (digits(k, pred) ) {
        std::string v = s_.substr(i, 2);
        for (size_t t = b; t < k; ++t) if (s_[t] != '_') v.push_back(s_[t]);
        emit(Token::Type::Integer, v, start);
        return k;
      }
    }
    size_t k = i;
    if (s_[i] == '0') {
      ++k;
      while (k < s_.size() && (s_[k] == '0' || (s_[k] == '_' && k + 1 < s_.size() && s_[k + 1] == '0'))) ++k;
    } else {
      digits(k, dec);
    }
    std::string v;
    for (size_t t = i; t < k; ++t) if (s_[t] != '_') v.push_back(s_[t]);
    emit(Token::Type::Integer, v, start);
    return k;
  }

  size_t lex_string(size_t i) {
    char q = s_[i];
    std::string raw;
    size_t k = i + 1;
    while (true) {
      if (k >= s_.size()) fail(i, "unexpected end of string");
      char c = s_[k];
      if (c == q) break;
      if (c == '\\') {
        if (k + 1 >= s_.size()) fail(i, "unexpected end of string");
        raw.push_back(c);
        raw.push_back(s_[k + 1]);
        k += 2;
        continue;
      }
      raw.push_back(c);
      ++k;
    }
    emit(Token::Type::String, unescape(raw, i), i);
    return k + 1;
  }

  // Python's "unicode-escape" decoding, as jinja2 applies it to string literals.
  std::string unescape(const std::string& r, size_t at) {
    std::string out;
    for (size_t k = 0; k < r.size(); ++k) {
      if (r[k] != '\\') { out.push_back(r[k]); continue; }
      char e = r[++k];
      auto hex = [&](int n) -> char32_t {
        if (k + static_cast<size_t>(n) >= r.size()) fail(at, "truncated \\x/\\u escape in string");
        char32_t v = 0;
        for (int t = 1; t <= n; ++t) {
          char h = r[k + t];
          if (!isxdigit(static_cast<unsigned char>(h))) fail(at, "truncated \\x/\\u escape in string");
          v = v * 16 + static_cast<char32_t>(isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
        }
        k += n;
        return v;
      };
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': {
          char32_t v = hex(8);
          if (v > 0x10FFFF) fail(at, "illegal Unicode character in string escape");
          utf8_append(out, v);
          break;
        }
        case 'N': fail(at, "unsupported construct: \\N{...} escape in string", TemplateError::Kind::Unsupported);
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int t = 0; t < 2 && k + 1 < r.size() && r[k + 1] >= '0' && r[k + 1] <= '7'; ++t)
              v = v * 8 + static_cast<char32_t>(r[++k] - '0');
            utf8_append(out, v);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  size_t lex_one(size_t i, std::vector<char>& balance) {
    char c = s_[i];
    if (isdigit(static_cast<unsigned char>(c))) return lex_number(i);
    if (isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t k = i;
      while (k < s_.size() && (isalnum(static_cast<unsigned char>(s_[k])) || s_[k] == '_')) ++k;
      emit(Token::Type::Name, s_.substr(i, k - i), i);
      return k;
    }
    if (c == '\'' || c == '"') return lex_string(i);
    static const char* two[] = {"**", "//", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (starts(i, op)) { emit(Token::Type::Operator, op, i); return i + 2; }
    }
    static const std::string one = "+-/*%~[](){}><=.:|,;";
    if (one.find(c) == std::string::npos) fail(i, std::string("unexpected character '") + c + "'");
    if (c == '(' || c == '[' || c == '{') balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(i, std::string("unexpected '") + c + "'");
      if (balance.back() != c) fail(i, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      balance.pop_back();
    }
    emit(Token::Type::Operator, std::string(1, c), i);
    return i + 1;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  // \r\n and \r become \n; without keep_trailing_newline one trailing newline is dropped.
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(source[i]);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s), options).run();
}

}  // namespace m3::text::tmpl
