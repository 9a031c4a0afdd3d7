// Running a shell command from a test: its exit code and what it printed; reading a whole file.
#pragma once
#include <string>

namespace m3::test {

struct CmdResult {
  int rc = -1;      // the exit code (-1: it did not exit normally, or could not start)
  std::string out;  // stdout, then stderr unless the command redirects it
};

// `cmd` through /bin/sh; with merge_stderr, " 2>&1" is appended.
CmdResult run_shell(const std::string& cmd, bool merge_stderr = true);

// The file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);

}  // namespace m3::test
