// add_tp_options (cli/tp_args.h).
#include "cli/tp_args.h"

#include <CLI/CLI.hpp>

namespace m3::cli {

void add_tp_options(CLI::App& app, int& tp, std::string& tp_comm, std::string& tp_launch) {
  app.add_option("--tp", tp,
                 "tensor-parallel ranks: threads of this process (rank r on GPU r mod the visible GPUs), or one "
                 "process each under mpirun (--tp-launch processes, or started by `mpirun -np N`): rank 0 runs "
                 "the command, the others follow its steps; a process that dies, hangs or is stopped ends the job within "
                 "10 s, naming it (M3_TP_LIVENESS_S, default 7 s of silence)")
      ->capture_default_str();
  app.add_option("--tp-comm", tp_comm,
                 "GPU tensor parallelism's collectives: nccl (one GPU per rank), host (through the host: ranks may "
                 "share a GPU; no CUDA graphs) or auto (nccl when every rank has its own GPU)")
      ->capture_default_str();
  app.add_option("--tp-launch", tp_launch,
                 "threads (the ranks in this process) or processes (this command starts itself again under "
                 "`mpirun -np N`, one process per rank; needs Open MPI's mpirun on PATH)")
      ->capture_default_str();
}

}  // namespace m3::cli
