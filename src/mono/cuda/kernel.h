// The mono persistent kernel's interface (kernel.cu): one cooperative launch of `grid` CTAs of
// kCtaThreads threads runs a task table (mono/task_table.h). CTA c walks its task list in runs of
// consecutive tasks of one op: its thread 0 waits (acquire loads, bounded) until the op the run
// depends on has completed `epoch` times its items, the CTA synchronizes, up to op.groups groups
// (threads k*op.threads .., named barrier 1 + k) run the run's items (group k: items k, k + G, ...),
// the CTA synchronizes, thread 0 fences and adds the run's length to the op's counter (release). A
// wait past the watchdog records the task and the counter in the error record (mapped host
// memory), raises the abort word, and every CTA stops at its next wait.
#pragma once
#include <cstdint>

#include "mono/task_table.h"

typedef struct CUstream_st* cudaStream_t;

namespace m3::mono {

constexpr int kCtaThreads = 512;  // 16 warps: the widest op group (32 P, P <= 16)
constexpr int kCounterStride = 16;  // uint64 per counter: one 128-byte line each

struct MonoError {
  int32_t code = 0;  // 0 none, 1 watchdog
  int32_t cta = -1, task = -1, op = -1, wait_op = -1, layer = -1;
  uint64_t target = 0, value = 0;
};

struct KernelArgs {
  const MonoOp* ops = nullptr;
  const MonoTask* tasks = nullptr;
  const int32_t* cta_begin = nullptr;   // [grid + 1]
  unsigned long long* counters = nullptr;  // [ops][kCounterStride]: completions of each op, over all epochs
  unsigned long long* epochs = nullptr;    // [grid]: runs completed by each CTA
  unsigned long long* seq = nullptr;       // serialized mode: tasks completed, over all epochs
  uint32_t* abort = nullptr;
  MonoError* error = nullptr;              // mapped host memory
  int64_t num_tasks = 0;
  uint64_t watchdog_ns = 0;
  int serialized = 0;
  int fault_op = -1;
  uint32_t poll_ns = 32;  // sleep between two polls of a waiting thread 0
  int fence = 0;          // __threadfence() before a completion's release add (MonoOptions::fence)
  // Optional: per task (its global order) three globaltimer stamps, ns: its run's wait begins
  // (the CTA's thread 0), the item begins and ends (its group's thread 0).
  unsigned long long* trace = nullptr;
};

// The kernel comes in builds, a mask: the decode kernel (0); kBuildVerify adds the op bodies only
// steps of more than 4 token rows use; kBuildWhole the split decode tile's whole walk (option
// fp8_whole). A program runs the build that is the union of its codes' build_of.
constexpr int kBuildVerify = 1, kBuildWhole = 2;
int build_of(OpCode c);
// The most dynamic shared memory one CTA of any build can have on the current device.
int kernel_max_dynamic_smem();
// CTAs of every build (the fewest) that fit on one SM with `smem` bytes of dynamic shared memory.
int kernel_ctas_per_sm(int smem);
// One cooperative launch of a build (fails instead of hanging when the grid cannot be co-resident).
void launch_kernel(const KernelArgs& a, int grid, int smem, int build, cudaStream_t stream);

}  // namespace m3::mono
