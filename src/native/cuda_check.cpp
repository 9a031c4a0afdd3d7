#include "native/cuda_check.h"

#include <cstdlib>
#include <cstring>

namespace m3 {
bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("M3_SYNC_LAUNCHES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}
}  // namespace m3
