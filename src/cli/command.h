// Subcommand registry: each cli/cmd_*.cpp registers itself with M3_COMMAND, so adding a
// subcommand never edits main.cpp. A command's setup() declares its flags on its CLI11 subapp and
// returns the function to run after parsing (its exit code).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace m3::cli {

using RunFn = std::function<int()>;
struct Command {
  std::string name;
  std::string help;
  std::function<RunFn(CLI::App&)> setup;
  int order = 100;  // position in --help
};

std::vector<Command>& registry();
struct Registrar {
  explicit Registrar(Command c) { registry().push_back(std::move(c)); }
};

}  // namespace m3::cli

#define M3_CONCAT_(a, b) a##b
#define M3_CONCAT(a, b) M3_CONCAT_(a, b)
#define M3_COMMAND(...) static ::m3::cli::Registrar M3_CONCAT(m3_cmd_, __LINE__)(::m3::cli::Command{__VA_ARGS__})
