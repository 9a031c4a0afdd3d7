// m3mono: the command-line entry point. Subcommands live in cli/cmd_*.cpp.
#include <algorithm>
#include <cstdio>

#include "cli/command.h"
#include "core/check.h"

namespace m3::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace m3::cli

int main(int argc, char** argv) {
  using namespace m3::cli;
  CLI::App app{"m3mono: MiniMax-M3 inference runtime (CPU reference, CUDA native and mono paths)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "m3mono 0.1.0");
  auto& cmds = registry();
  std::stable_sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  std::vector<std::pair<CLI::App*, RunFn>> runs;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const m3::Error& e) {
    std::fprintf(stderr, "m3mono: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "m3mono: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
