// run_shell / read_file (common/process.h).
#include "common/process.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace m3::test {

CmdResult run_shell(const std::string& cmd, bool merge_stderr) {
  CmdResult r;
  FILE* p = popen((merge_stderr ? cmd + " 2>&1" : cmd).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace m3::test
