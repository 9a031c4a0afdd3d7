// Rank 0 leads, the other ranks follow (issue 14; docs/tensor-parallel.md): under `mpirun -np N`
// every process is one tensor-parallel rank, but only rank 0 runs the command (the scheduler, the
// HTTP server, the report). Each step rank 0 is asked to run is first broadcast to the others, who
// run the very same step on their shard, so every rank calls the same collectives in the same
// order with the same sizes, whatever decided the batch (timing, requests arriving, a rank-local
// counter): the step's shape is rank 0's by construction.
//
// Protocol (over a runtime Communicator): a 16-byte header {kind, flags, payload bytes} broadcast
// from rank 0, then the payload when it has bytes. Kinds: a step (the encoded StepBatch; flags:
// trace requested, record_cache), idle (a heartbeat: rank 0 sends one when no message went out for
// `heartbeat`, so a follower's wait never reaches the communicator's timeout while rank 0 waits for
// requests), stop (rank 0's backend is closing: the followers return).
// A follower that hears nothing from rank 0 for 10 s once it has spoken (no step, no heartbeat)
// ends the job naming rank 0 (MPI: its wait limit, Communicator::set_wait_limit).
// A step that fails on a follower is the follower's to report (stderr) and the loop goes on: the
// ranks validate a batch alike, so rank 0 fails it too; a failure the group cannot survive (a
// collective that fails) ends the follower with the error (the caller then makes its communicator
// fail, so rank 0 learns of it too).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace m3 {

// The bytes of a step as broadcast (every field of every SeqStep and the aux layers; versioned),
// and back. decode_step throws naming what is malformed (a truncated or foreign message).
std::vector<uint8_t> encode_step(const StepBatch& batch);
StepBatch decode_step(const uint8_t* data, size_t bytes);

struct LeaderOptions {
  // the longest silence towards the followers (well below their 10 s limit)
  std::chrono::milliseconds heartbeat{2000};
};

// Rank 0's backend: broadcasts each step to the followers, then runs it on `rank0` (its shard).
// The destructor sends stop. comm->rank() must be 0.
std::unique_ptr<Backend> make_tp_leader(std::unique_ptr<Backend> rank0, std::shared_ptr<Communicator> comm,
                                        LeaderOptions opt = {});

// A follower's loop (comm.rank() > 0): runs every step rank 0 broadcasts on `rank`, until stop.
// Returns the number of steps run; throws when the group fails (a collective error).
int64_t follow_tp_leader(Backend& rank, Communicator& comm);

}  // namespace m3
