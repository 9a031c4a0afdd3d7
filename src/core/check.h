// One checker for the whole project. Every host-side condition, CUDA/cuBLAS/NCCL status and
// input validation goes through M3_CHECK (or the typed wrappers built on it), which throws
// m3::Error carrying file:line and a formatted message naming the offending values.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__CUDACC__)
// NOTE: fmt 9 does not compile under nvcc's host pass, so translation units compiled by nvcc
// format check messages with a small run-time "{}" substitution instead.
#include <sstream>
#include <string_view>
#else
#include <fmt/format.h>
#endif

namespace m3 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

#if defined(__CUDACC__)
inline void check_format_rest(std::ostringstream& os, std::string_view f) { os << f; }
template <class A, class... R>
void check_format_rest(std::ostringstream& os, std::string_view f, const A& a, const R&... r) {
  auto p = f.find("{}");
  if (p == std::string_view::npos) { os << f; return; }
  os << f.substr(0, p) << a;
  check_format_rest(os, f.substr(p + 2), r...);
}
template <class... A>
std::string check_format(std::string_view f, const A&... a) {
  std::ostringstream os;
  check_format_rest(os, f, a...);
  return os.str();
}
#else
template <class... A>
std::string check_format(fmt::format_string<A...> f, A&&... a) {
  return fmt::format(f, std::forward<A>(a)...);
}
#endif

}  // namespace m3

// M3_CHECK(cond, "fmt {}", args...): throws m3::Error("... (file:line)") when cond is false.
#define M3_CHECK(cond, ...)                                                  \
  do {                                                                       \
    if (!(cond)) [[unlikely]]                                                \
      ::m3::throw_error(__FILE__, __LINE__, ::m3::check_format(__VA_ARGS__)); \
  } while (0)

// M3_FAIL("fmt {}", args...): unconditional error.
#define M3_FAIL(...) ::m3::throw_error(__FILE__, __LINE__, ::m3::check_format(__VA_ARGS__))
