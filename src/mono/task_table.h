// The mono kernel's program for one decode bucket (plain C++, built on the host, tested on the
// CPU): the sparse layers' plan ops (native/layer_plan.h) as op records (op code, the group size
// and shared memory of its WorkShape, its params bytes, the op it waits for), and every op's work
// items distributed over the persistent CTAs as static per-CTA task lists.
//
// Order and dependencies (v0): the global order is (op, item) in plan order; op i's items wait
// until every item of op i - 1 has completed (TablePlacement::early relaxes one of these: see there) (one counter per op; each op reads only what earlier
// ops wrote, and op i - 1's completion implies all earlier ones'), so a CTA only ever waits for
// tasks that come before its own in the global order; with every CTA resident (the cooperative
// launch) no wait can deadlock. check_task_order() proves that on the built table. Serialized
// (debug) mode: task g waits for task g - 1 instead (one at a time, the same bits).
// Counters are epoch-based: the target of a wait is epoch x (the waited op's items), where the
// epoch is the number of times the kernel ran (per-CTA, in device memory), so graph replays need
// no reset.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mono/op_code.h"
#include "native/op_call.h"

namespace m3::mono {

constexpr int kParamBytes = 400;  // the largest op params (MmaRopeParams; static_assert in task_table.cpp)

struct alignas(16) MonoOp {
  uint8_t code = 0;          // OpCode
  uint8_t groups = 1;        // items of this op one CTA runs side by side (groups of `threads`)
  uint8_t stage = 0;         // staged weight tiles (TablePlacement::stage): 1 decode projection, 2 MoE wide
  uint8_t pad0 = 0;
  int32_t threads = 0;       // the group that runs one item (the WorkShape's threads)
  int32_t smem = 0;          // its shared memory (each group's slice, 16-byte aligned)
  int32_t wait_op = -1;      // op whose items must all be done first (-1: none)
  int64_t items = 0;
  int32_t layer = -1;
  int32_t first_task = 0;    // global order of its item 0 (serialized mode)
  int32_t stage_wait = -1;   // stage 2: the op whose completion the copies need (the routing), else -1
  int32_t wait_op2 = -1;     // a second op whose items must all be done first (TablePlacement::early)
  // the items of wait_op and wait_op2 (0 for none): a waiting thread reads its targets from its own
  // op's record instead of the waited ops' (one dependent global load less before its first poll)
  int32_t wait_items = 0, wait_items2 = 0;
  alignas(16) uint8_t params[kParamBytes] = {};
};
static_assert(sizeof(MonoOp) == 48 + kParamBytes, "MonoOp layout (the kernel reads it)");
constexpr int kMaxGroups = 15;  // named barriers 1 .. 15 (barrier 0 is the CTA's)

struct MonoTask {
  int32_t op = 0;
  int32_t item = 0;
};

struct TaskTable {
  std::vector<MonoOp> ops;
  std::vector<MonoTask> tasks;     // CTA c's tasks are [cta_begin[c], cta_begin[c + 1]), in global order
  std::vector<int32_t> cta_begin;  // [grid + 1]
  int grid = 0;
  int max_threads = 0, max_smem = 0;
  int64_t num_tasks() const { return int64_t(tasks.size()); }
};

// Builds the table of ops over `grid` CTAs of `cta_threads` threads and at most `cta_smem` bytes of
// shared memory. An op whose groups are narrower than the CTA runs its consecutive tasks in a CTA's
// list on up to min(cta_threads / threads, cta_smem / smem, kMaxGroups) groups side by side.
// Refusals (an op mono does not run, a group larger than the CTA or its shared memory, an item
// count past int32) are appended to *why and the result is then empty.
// Placement (TablePlacement): which CTA runs each item. Round robin (pin = false): item w of op i
// goes to CTA (first_task(i) + w) % grid, consecutive ops continuing where the previous one ended.
// Pinned (the default): by op code instead, so every layer's op runs on the same SMs and its code
// stays in their instruction caches (measured: the latency-bound small ops ran 1.06-1.49x slower
// round robin, the step 9% slower). With reserve = R > 0, the last R CTAs run only the small ops (at most
// `small` items: norms, RoPE, top-k, combines, routing), which run only there: those SMs hold
// just the small ops' code; the other ops are spread over the first grid - R CTAs.
// Staging (stage: a mask, 1 the FP8 decode projections (qkv, O: op.stage 1), 2 the MoE wide expert
// ops (gate/up, down: op.stage 2, when kernels::moe_can_stage), 4 the O projection alone): each
// group's first item of a run copy its weight tile into the group's shared memory (kernels::mma_stage_tile /
// moe_stage_tile) while the CTA waits for the item's inputs; op.smem then holds the tile too
// (which may lower op.groups). An expert tile needs the routing: stage_wait names the layer's route
// op (the writer of the op's entry list), whose completion the copies wait for first. The items of
// a run past its groups run unstaged (MoE: on the register path), with the same bits.
struct TablePlacement {
  bool pin = true;
  int reserve = 0;
  int small = 8;
  int stage = 0;  // off by default: measured slower (docs/mono.md)
  // ring: which MoE wide ops of the staged ring (cp.async) keep it: 0 none (the default), 1 all,
  // 2 the gate/up ops only (SwiGLU). The others run on the register path (the same bits) with only
  // their partials' shared memory, so the kernel needs less and the SMs keep a larger L1 (measured:
  // ring 1 -> 0, b=1 -12%, docs/perf.md 2026-12-02).
  int ring = 0;
  // early = true: the MoE split (it reads only the post-attention norm's output, as the router
  // does) waits for that norm instead of the routing, so it runs beside the router GEMV and the
  // routing; the gate/up op then waits for both the split and the routing (wait_op2). Default on.
  bool early = true;
  // stream = true: the FP8 decode projections (qkv, O) run streamed (kernels/mma_stream.cuh: each
  // chain's weights copied whole into shared memory by the copy engine, then walked from there)
  // whatever the plan's params chose; false: the register walk. The same bits and groups. Off:
  // measured slower (docs/perf.md 2026-12-03: the tiles' shared memory takes the L1 every op leans on).
  bool stream = false;
  // fp8_whole = true: the decode tiles over split activations (qkv, O) walk whole items on four
  // register groups of one block (mma_decode_fp8_split_whole), as native's tile does; false:
  // chain_sum. The same bits. Off: not measured yet (ptxas 2026-12-07: 160 / 188 B of spills, about
  // 4.5 local loads and stores a block inside the loop, 119 instructions a block against 173).
  bool fp8_whole = false;
  // smem_cap > 0: an op runs at most smem_cap / op.smem groups side by side (at least one), so the
  // kernel needs at most max(smem_cap, the largest op.smem) bytes and the L1 keeps the rest.
  int smem_cap = 0;
};
TaskTable build_task_table(std::span<const native::OpCall> plan_ops, int grid, int cta_threads, int cta_smem,
                           std::vector<std::string>* why, const TablePlacement& place = {});

// "" when every task waits only for tasks earlier in the global order and every wait can be met
// (its op has items), else the first violation.
std::string check_task_order(const TaskTable& t);

}  // namespace m3::mono
