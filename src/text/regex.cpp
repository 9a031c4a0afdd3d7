#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"
#include "text/unicode_delta.h"

namespace m3::text {
namespace {

constexpr const char* kSpace = "\\p{White_Space}";
constexpr const char* kNotSpace = "\\P{White_Space}";
constexpr const char* kHex = "0-9a-fA-F";

// \p{name} plus the code points Oniguruma has in it beyond PCRE2's tables (class-body syntax).
std::string prop_body(const std::string& name) {
  std::string out = "\\p{" + name + "}";
  for (const auto& d : unicode_category_deltas())
    if (name == d.category) out += d.ranges;
  return out;
}

bool has_delta(const std::string& name) { return prop_body(name).size() > name.size() + 4; }

std::string word_body() { return prop_body("L") + prop_body("M") + prop_body("Nd") + prop_body("Pc"); }

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string onig_to_pcre2(const std::string& p, const std::string& what) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // index in p just past '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      M3_CHECK(i + 1 < p.size(), "{}: pattern ends in a lone backslash", what);
      char e = p[++i];
      switch (e) {
        case 's': out += in_class ? std::string(kSpace) : std::string("[") + kSpace + "]"; break;
        case 'S': out += in_class ? std::string(kNotSpace) : std::string("[") + kNotSpace + "]"; break;
        case 'w': out += in_class ? word_body() : "[" + word_body() + "]"; break;
        case 'd': out += in_class ? prop_body("Nd") : "[" + prop_body("Nd") + "]"; break;
        case 'D':
          M3_CHECK(!in_class, "{}: \\D inside a character class is not supported (pattern '{}')", what, p);
          out += "[^" + prop_body("Nd") + "]";
          break;
        case 'W':
          M3_CHECK(!in_class, "{}: \\W inside a character class is not supported (pattern '{}')", what, p);
          out += "[^" + word_body() + "]";
          break;
        case 'h': out += in_class ? std::string(kHex) : std::string("[") + kHex + "]"; break;
        case 'H':
          M3_CHECK(!in_class, "{}: \\H inside a character class is not supported (pattern '{}')", what, p);
          out += std::string("[^") + kHex + "]";
          break;
        case 'b':
        case 'B':
          M3_CHECK(in_class, "{}: word boundaries (\\{}) are not supported: Oniguruma's word characters differ "
                   "from PCRE2's (pattern '{}')", what, e, p);
          out += '\\';
          out += e;
          break;
        case 'p':
        case 'P':
          if (i + 1 < p.size() && p[i + 1] == '{') {
            size_t close = p.find('}', i + 1);
            M3_CHECK(close != std::string::npos, "{}: unterminated \\{}{{...}} in pattern '{}'", what, e, p);
            std::string name = p.substr(i + 2, close - i - 2);
            i = close;
            if (!has_delta(name)) {
              out += std::string("\\") + e + "{" + name + "}";
            } else if (e == 'p') {
              out += in_class ? prop_body(name) : "[" + prop_body(name) + "]";
            } else {
              M3_CHECK(!in_class, "{}: \\P{{{}}} inside a character class is not supported (pattern '{}')", what,
                       name, p);
              out += "[^" + prop_body(name) + "]";
            }
            break;
          }
          out += '\\';
          out += e;
          break;
        case 'x':
          out += '\\';
          out += e;
          if (i + 1 < p.size() && p[i + 1] == '{') {  // copy the braces whole
            size_t close = p.find('}', i + 1);
            M3_CHECK(close != std::string::npos, "{}: unterminated \\{}{{...}} in pattern '{}'", what, e, p);
            out.append(p, i + 1, close - i);
            i = close;
          }
          break;
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i > class_start) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
          size_t close = p.find(":]", i + 2);
          M3_CHECK(close != std::string::npos, "{}: unterminated [: in pattern '{}'", what, p);
          out.append(p, i, close + 2 - i);
          i = close + 1;
          continue;
        }
        M3_FAIL("{}: nested character classes are not supported (pattern '{}', offset {})", what, p, i);
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        M3_FAIL("{}: class intersection (&&) is not supported (pattern '{}', offset {})", what, p, i);
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    out += c;
  }
  M3_CHECK(!in_class, "{}: unterminated character class in pattern '{}'", what, p);
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

// Per-thread match state (any pattern may use it): match data for group 0 and a JIT stack large
// enough for long whitespace runs, so one Regex serves many threads.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  MatchState() {
    M3_CHECK(md && stack && mctx, "regex: out of memory");
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};

MatchState& match_state() {
  thread_local MatchState st;
  return st;
}

// What a failed search ran into, naming the limit and its value.
std::string failure(int rc, const RegexLimits& l) {
  switch (rc) {
    case PCRE2_ERROR_MATCHLIMIT: return "the match limit (" + std::to_string(l.match) + " backtracking steps) was exceeded";
    case PCRE2_ERROR_DEPTHLIMIT: return "the depth limit (" + std::to_string(l.depth) + " nested backtracking points) was exceeded";
    case PCRE2_ERROR_HEAPLIMIT: return "the heap limit (" + std::to_string(l.heap_kib) + " KiB of backtracking memory) was exceeded";
    case PCRE2_ERROR_JIT_STACKLIMIT: return "the JIT stack limit (" + std::to_string(kJitStackBytes >> 20) + " MiB) was exceeded";
    default: return "PCRE2 error " + std::to_string(rc);
  }
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& what, const RegexLimits& limits)
    : source_(pattern), what_(what), limits_(limits) {
  compiled_ = onig_to_pcre2(pattern, what);
  compile(what);
}

Regex Regex::literal(const std::string& literal, const std::string& what, const RegexLimits& limits) {
  Regex r;
  r.source_ = literal;
  r.what_ = what;
  r.limits_ = limits;
  r.compiled_ = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {  // \E inside \Q..\E ends the quote: split it
    if (literal.compare(i, 2, "\\E") == 0) {
      r.compiled_ += "\\E\\\\\\QE";
      ++i;
    } else {
      r.compiled_ += literal[i];
    }
  }
  r.compiled_ += "\\E";
  r.compile(what);
  return r;
}

void Regex::compile(const std::string& what) {
  impl_ = std::make_unique<Impl>();
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_.data()), compiled_.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  M3_CHECK(impl_->code, "{}: the pattern '{}' does not compile: {} (at offset {} of '{}')", what, source_,
           pcre2_message(err), size_t(off), compiled_);
  impl_->jit = limits_.jit && pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  MatchState& st = match_state();
  pcre2_match_data* md = st.md;
  // (the context is the thread's, shared by every pattern: each search sets its own limits)
  pcre2_set_match_limit(st.mctx, limits_.match);
  pcre2_set_depth_limit(st.mctx, limits_.depth);
  pcre2_set_heap_limit(st.mctx, limits_.heap_kib);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= s.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, s.size(), pos, 0, md, st.mctx)
                        : pcre2_match(impl_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      M3_FAIL("{}: regex '{}': the search from byte {} of a {}-byte text stopped: {} ({})", what_, source_, pos,
              s.size(), failure(rc, limits_), pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t a = ov[0], b = ov[1];
    if (a == b && have_last && last_end == b) {  // empty match glued to the previous one: step a character
      if (pos >= s.size()) break;
      unsigned char c = static_cast<unsigned char>(s[pos]);
      pos += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      continue;
    }
    out.emplace_back(a, b);
    have_last = true;
    last_end = b;
    pos = b;
  }
}

}  // namespace m3::text
