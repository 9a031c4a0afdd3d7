// add_tp_options (cli/tp_args.h).
#include "cli/tp_args.h"

#include <CLI/CLI.hpp>

namespace m3::cli {

void add_tp_options(CLI::App& app, int& tp, std::string& tp_comm) {
  app.add_option("--tp", tp,
                 "tensor-parallel ranks: the CPU reference runs them as threads of this process (one per process "
                 "under mpirun); the GPU path as threads of this process, rank r on GPU r mod the visible GPUs")
      ->capture_default_str();
  app.add_option("--tp-comm", tp_comm,
                 "GPU tensor parallelism's collectives: nccl (one GPU per rank), host (through the host: ranks may "
                 "share a GPU; no CUDA graphs) or auto (nccl when every rank has its own GPU)")
      ->capture_default_str();
}

}  // namespace m3::cli
