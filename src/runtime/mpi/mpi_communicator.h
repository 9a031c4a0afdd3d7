// The MPI engine of the Communicator (runtime/communicator.h): ranks are the processes of an
// `mpirun -np N` job (one host or several), one rank per process. Built when CMake finds MPI
// (Debian: libopenmpi-dev; M3_WITH_MPI).
//
// The contracts of communicator.h, kept over MPI:
//   - before every collective the ranks exchange what they are about to call (kind, bytes, root;
//     MPI_Allgather of a small header) and every rank checks all of them: a rank that calls another
//     collective or another size makes the call throw on EVERY rank, naming each rank's call;
//   - all_reduce_sum is an all-gather of every rank's values followed by the sum in rank order on
//     each rank (((r0 + r1) + r2) + ...), so the bits do not depend on MPI's reduction algorithm
//     and every rank holds the same;
//   - fail(why) prints why on stderr and aborts the job (MPI_Abort): mpirun stops every other
//     rank at once, naming this one; a rank that dies is handled the same way by mpirun;
//   - a collective that does not complete within the timeout (a rank alive but stuck) prints which
//     collective waited and aborts the job (M3_TP_TIMEOUT_S, default 600 s: loading weights on a
//     slow rank must not trip it).
#pragma once
#include <memory>

#include "runtime/communicator.h"

namespace m3 {

// MPI_COMM_WORLD's communicator (MPI initialized on first use, finalized at exit). Throws when the
// process was not started by an MPI launcher.
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace m3
