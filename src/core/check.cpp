#include "core/check.h"

#include <cstring>

namespace m3 {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(fmt::format("{} ({}:{})", msg, base ? base + 1 : file, line));
}

}  // namespace m3
