// parse_options (mono/options.h).
#include "mono/options.h"

#include <charconv>

#include "core/check.h"

namespace m3::mono {

namespace {

template <class T>
T number(const std::string& key, const std::string& v) {
  T x{};
  const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  M3_CHECK(r.ec == std::errc() && r.ptr == v.data() + v.size(), "mono options: {}={} is not a number", key, v);
  return x;
}

}  // namespace

MonoOptions parse_options(const std::string& text, MonoOptions o) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('/', at);
    if (end == std::string::npos) end = text.size();
    const std::string kv = text.substr(at, end - at);
    at = end + 1;
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    M3_CHECK(eq != std::string::npos && eq > 0, "mono options: '{}' is not key=value", kv);
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "poll_ns") o.poll_ns = number<int>(k, v);
    else if (k == "pin") o.place.pin = number<int>(k, v) != 0;
    else if (k == "reserve") o.place.reserve = number<int>(k, v);
    else if (k == "small") o.place.small = number<int>(k, v);
    else if (k == "stage") o.place.stage = number<int>(k, v);
    else if (k == "smem_min") o.smem_min = number<int>(k, v);
    else if (k == "ring") o.place.ring = number<int>(k, v);
    else if (k == "early") o.place.early = number<int>(k, v) != 0;
    else if (k == "stream") o.place.stream = number<int>(k, v) != 0;
    else if (k == "fp8_whole") o.place.fp8_whole = number<int>(k, v) != 0;
    else if (k == "smem_cap") o.place.smem_cap = number<int>(k, v);
    else if (k == "fence") o.fence = number<int>(k, v) != 0;
    else if (k == "grid") o.grid = number<int>(k, v);
    else if (k == "serialized") o.serialized = number<int>(k, v) != 0;
    else if (k == "watchdog_ms") o.watchdog_ms = number<double>(k, v);
    else M3_FAIL("mono options: unknown key '{}' (known: poll_ns, pin, reserve, small, stage, smem_min, smem_cap, ring, early, stream, fp8_whole, fence, grid, serialized, watchdog_ms)", k);
  }
  return o;
}

}  // namespace m3::mono
