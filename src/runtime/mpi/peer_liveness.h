// Liveness of the other processes of an mpirun job, independent of the collectives (issue 14: a
// rank that hangs mid-step must end the job within 10 s, naming it).
//
// A thread per process, on a communicator of its own (MPI_THREAD_MULTIPLE), sends a heartbeat to
// every peer every `beat` and reads theirs. A peer that has sent nothing for `silence` (stopped,
// hung in a kernel or a system call, its host gone) makes this process print which rank went
// silent and how long ago, and end the job (MPI_Abort, so mpirun stops every rank with a non-zero
// exit). The heartbeat thread runs whatever the main thread is doing (loading weights, a long
// step, a collective, an NCCL kernel that waits for the silent rank), so a slow rank is never
// taken for a hung one, and a rank stuck anywhere is found, not only one a collective waits on.
// A process that ends in order says goodbye first (stop(), called before MPI_Finalize): its
// peers stop watching it, and a collective that then waits for it fails at once (left()).
//
// M3_TP_LIVENESS_S sets the silence (default 7 s; 0 turns the watch off, e.g. under a debugger).
// Without MPI_THREAD_MULTIPLE the watch is off and the collectives' own limit (M3_TP_TIMEOUT_S)
// is what ends a stuck job.
#pragma once
#include <chrono>
#include <string>

#include <mpi.h>

namespace m3 {

struct LivenessOptions {
  std::chrono::milliseconds beat{500};
  std::chrono::milliseconds silence{7000};
};

// Starts the watch over `world`'s ranks (once per process; later calls do nothing). Returns
// whether it runs.
bool start_peer_liveness(MPI_Comm world, LivenessOptions opt);
// Says goodbye to the peers and stops the thread (before MPI_Finalize; idempotent).
void stop_peer_liveness();
// The ranks that said goodbye, as "rank 2, rank 3" ("" when none, or no watch runs).
std::string peers_left();
// The silence from M3_TP_LIVENESS_S (0: off).
std::chrono::milliseconds liveness_silence_from_env();

}  // namespace m3
