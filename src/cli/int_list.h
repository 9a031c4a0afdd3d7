// Comma-separated integer lists on the command line (--prompt-ids 1,15,92; --layers 3,20), with
// errors that start with `what` (e.g. "generate: --prompt-ids") and name the bad entry.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::cli {

// Entries separated by commas; spaces around an entry are allowed; an empty list or entry is an error.
std::vector<long long> parse_int_list(const std::string& s, const std::string& what);

// parse_int_list with every entry a token id in [0, INT32_MAX] (the vocabulary is checked later).
std::vector<int32_t> parse_token_ids(const std::string& s, const std::string& what);

// The contents of a prompt file: token ids separated by commas and/or whitespace (newlines too).
// Errors name the file.
std::vector<int32_t> read_token_id_file(const std::string& path, const std::string& what);

}  // namespace m3::cli
