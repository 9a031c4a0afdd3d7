// The tensor-parallel flags of generate, serve and conformance (cli/backend_choice.h: --tp, --tp-comm,
// --tp-launch).
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace m3::cli {

void add_tp_options(CLI::App& app, int& tp, std::string& tp_comm, std::string& tp_launch);

}  // namespace m3::cli
