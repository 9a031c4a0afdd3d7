#include "cli/int_list.h"

#include <cctype>
#include <climits>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace m3::cli {

std::vector<long long> parse_int_list(const std::string& s, const std::string& what) {
  std::vector<long long> out;
  std::stringstream ss(s);
  for (std::string tok; std::getline(ss, tok, ',');) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      M3_FAIL("{} entry '{}' is not an integer", what, tok);
    }
    M3_CHECK(used == tok.size() || tok.find_first_not_of(" ", used) == std::string::npos,
             "{} entry '{}' is not an integer", what, tok);
    out.push_back(v);
  }
  M3_CHECK(!out.empty(), "{} is empty", what);
  return out;
}

std::vector<int32_t> parse_token_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> out;
  for (long long v : parse_int_list(s, what)) {
    M3_CHECK(v >= 0 && v <= INT32_MAX, "{} entry {} is out of range", what, v);
    out.push_back(int32_t(v));
  }
  return out;
}

std::vector<int32_t> read_token_id_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "{}: cannot open '{}'", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  M3_CHECK(!in.bad(), "{}: error reading '{}'", what, path);
  // every run of commas and whitespace is one separator
  std::string text = ss.str(), list;
  bool sep = true;
  for (char ch : text) {
    if (ch == ',' || std::isspace(static_cast<unsigned char>(ch))) {
      sep = true;
      continue;
    }
    if (sep && !list.empty()) list += ',';
    sep = false;
    list += ch;
  }
  M3_CHECK(!list.empty(), "{} '{}' holds no token ids", what, path);
  return parse_token_ids(list, what + " '" + path + "'");
}

}  // namespace m3::cli
