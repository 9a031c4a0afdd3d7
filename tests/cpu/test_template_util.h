// Shared by the chat-template tests: rendering through Python jinja2 (tests/py/jinja_oracle.py,
// configured as transformers configures it) and a byte comparator that reports the first
// difference with context.
#pragma once
#include <gtest/gtest.h>

#include "common/process.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/temp_dir.h"

namespace m3::test {

struct OracleResult {
  bool ok;
  std::string text;  // rendered text, or the Python exception
};

inline bool have_jinja2() {
  static int have = -1;
  if (have < 0) have = std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
  return have == 1;
}

// Renders spec ({"templates": {...}, "cases": [...]}) with jinja2; fails the test on a harness error.
inline std::vector<OracleResult> run_jinja_oracle(const nlohmann::ordered_json& spec) {
  TempDir dir;
  {
    std::ofstream f(dir / "in.json", std::ios::binary);
    f << spec.dump();
  }
  std::string cmd = std::string("python3 ") + M3_SOURCE_DIR + "/tests/py/jinja_oracle.py " + (dir / "in.json") + " " +
                    (dir / "out.json") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string log;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) log.append(buf, n);
  int rc = pclose(p);
  std::vector<OracleResult> out;
  if (rc != 0) {
    ADD_FAILURE() << "jinja_oracle.py failed (rc " << rc << "): " << log;
    return out;
  }
  std::ifstream f(dir / "out.json", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  for (const auto& r : nlohmann::json::parse(ss.str()))
    out.push_back({r["ok"].get<bool>(), r["ok"].get<bool>() ? r["text"].get<std::string>() : r["error"].get<std::string>()});
  return out;
}

inline std::string escape_for_report(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); o += b; }
    else o.push_back(static_cast<char>(c));
  }
  return o;
}

// Empty when equal; else where the first byte differs, with 40 bytes of context from each side.
inline std::string first_difference(const std::string& want, const std::string& got) {
  if (want == got) return "";
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (jinja2 " << want.size() << " bytes, m3 " << got.size() << " bytes)\n"
     << "  jinja2: ..." << escape_for_report(want.substr(from, i - from)) << "[[" << escape_for_report(want.substr(i, 40)) << "]]\n"
     << "  m3:     ..." << escape_for_report(got.substr(from, i - from)) << "[[" << escape_for_report(got.substr(i, 40)) << "]]";
  return os.str();
}

}  // namespace m3::test
