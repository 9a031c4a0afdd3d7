// run_chart_script (cuda_bench.h): finds tools/bench_chart.py and runs it with python3. Only
// `m3mono bench --chart` calls it; nothing else (CI included) depends on python or matplotlib.
#include <cstdlib>
#include <filesystem>

#include "bench/cuda_bench.h"
#include "core/check.h"

#ifndef M3_SOURCE_DIR
#define M3_SOURCE_DIR "."
#endif

namespace m3::bench {

namespace {
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

int run_chart_script(const std::string& json_path, const std::string& png_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string script;
  if (const char* e = std::getenv("M3_BENCH_CHART"); e && *e) script = e;
  else if (fs::exists("tools/bench_chart.py", ec)) script = "tools/bench_chart.py";
  else script = std::string(M3_SOURCE_DIR) + "/tools/bench_chart.py";
  M3_CHECK(fs::exists(script, ec), "bench: --chart: cannot find bench_chart.py (tried {}; set M3_BENCH_CHART)", script);
  const std::string cmd = "python3 " + quote(script) + " " + quote(json_path) + " " + quote(png_path);
  int rc = std::system(cmd.c_str());
  return rc == -1 ? 127 : WEXITSTATUS(rc);
}

}  // namespace m3::bench
