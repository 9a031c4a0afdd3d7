// build_task_table / check_task_order (mono/task_table.h).
#include "mono/task_table.h"

#include <fmt/format.h>

#include <cstring>
#include <string_view>

namespace m3::mono {

namespace {
// The plan's ops with each fused down projection (OpKind::MoeDownCombine) as its two ops, the down
// op then the combine (the same sums, so the same bits): the mono kernel runs the down items on the
// unfused op's body. Inlined into that body, the fused tail made ptxas spill the walk's main loop
// more (112 / 268 -> 196 / 408 B), and as a second body called after it, every other body's spill
// loads grew by 8-24 B (2026-12-07). With such an op in the plan, the table's op indices are the
// expanded list's (MonoOptions::fault_op and the watchdog's "op N" count the combine as an op).
std::vector<native::OpCall> unfuse_down_combine(std::span<const native::OpCall> ops) {
  std::vector<native::OpCall> out;
  out.reserve(ops.size() + 64);
  for (const native::OpCall& c : ops) {
    if (c.kind != native::OpKind::MoeDownCombine) {
      out.push_back(c);
      continue;
    }
    const auto& p = std::get<kernels::MoeDownCombineParams>(c.params);
    out.push_back(native::OpCall{native::OpKind::MoeMma, c.stage, "down", c.layer, p.down});
    out.push_back(native::OpCall{native::OpKind::MoeCombine, c.stage, "combine", c.layer, p.combine});
  }
  return out;
}
}  // namespace

TaskTable build_task_table(std::span<const native::OpCall> plan_ops, int grid, int cta_threads, int cta_smem,
                           std::vector<std::string>* why, const TablePlacement& place) {
  const std::vector<native::OpCall> expanded = unfuse_down_combine(plan_ops);
  const std::span<const native::OpCall> ops(expanded);
  TaskTable t;
  const size_t refused = why ? why->size() : 0;
  auto refuse = [&](std::string s) {
    if (why) why->push_back(std::move(s));
  };
  if (grid <= 0 || cta_threads <= 0 || cta_threads % 32 != 0) {
    refuse(fmt::format("mono: grid {} x {} threads", grid, cta_threads));
    return {};
  }
  if (ops.empty()) {
    refuse("mono: no ops in the layer range");
    return {};
  }
  int64_t total = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const native::OpCall& c = ops[i];
    std::string w;
    const auto code = op_code(c, &w);
    if (!code) {
      refuse(w);
      continue;
    }
    const kernels::WorkShape sh = native::op_shape(c);
    MonoOp o;
    o.code = uint8_t(*code);
    if (*code == OpCode::MmaDecodeFp8Split && place.fp8_whole) o.code = uint8_t(OpCode::MmaDecodeFp8SplitWhole);
    o.threads = sh.threads;
    o.smem = (sh.smem_bytes + 15) / 16 * 16;
    if (const auto* ep = std::get_if<kernels::MoeMmaParams>(&c.params);
        ep && *code == OpCode::MoeWideStaged3 && !(place.ring == 1 || (place.ring == 2 && ep->swiglu))) {
      // the same items on the register path (the same bits), without the ring's shared memory
      o.code = uint8_t(OpCode::MoeWideRegs);
      o.smem = (kernels::moe_wide_smem_bytes(ep->chains, 0) + 15) / 16 * 16;
    }
    if (const auto* mp = std::get_if<kernels::MmaLinearParams>(&c.params);
        mp && (*code == OpCode::MmaDecodeFp8F32 || *code == OpCode::MmaStreamFp8F32)) {
      // the decode tile streamed or on the register walk, as the placement says (the same bits and
      // group of 32 P threads); staged (the register walk, its tile copied during the wait)
      const bool staged = (place.stage & 1) || ((place.stage & 4) && std::string_view(c.stage) == "o");
      const bool stream = place.stream && !staged;
      o.code = uint8_t(stream ? OpCode::MmaStreamFp8F32 : OpCode::MmaDecodeFp8F32);
      o.smem = ((stream ? kernels::mma_stream_smem_bytes(mp->K, mp->chains)
                        : kernels::mma_wide_smem_floats(1, 1, mp->chains) * 4) + 15) / 16 * 16;
      if (staged) {
        o.stage = 1;
        o.smem = int(kernels::mma_staged_tile_offset(mp->chains) + kernels::mma_staged_tile_bytes(mp->ld_w) + 127) / 128 * 128;
      }
    }
    if (const auto* ep = std::get_if<kernels::MoeMmaParams>(&c.params); (place.stage & 2) && ep &&
        (*code == OpCode::MoeWideStaged3 || *code == OpCode::MoeWideRegs) && kernels::moe_can_stage(*ep)) {
      // the latest route op before it that writes its entry list
      for (size_t j = i; j-- > 0;) {
        const auto* rp = std::get_if<kernels::MoeRouteParams>(&ops[j].params);
        if (const auto* fp = std::get_if<kernels::RouterGemvRouteParams>(&ops[j].params)) rp = &fp->route;
        if (rp && rp->group.entry_slot == ep->entry_slot && rp->group.num_entries == ep->num_entries) {
          o.stage = 2;
          o.stage_wait = int32_t(j);
          // partials, then the tile; the items past the groups take the register path (no ring)
          o.smem = int(kernels::moe_staged_tile_offset(ep->chains) + kernels::moe_staged_tile_bytes(ep->ld, ep->sld) +
                       127) / 128 * 128;
          break;
        }
      }
    }
    int groups = sh.threads > 0 ? std::min(cta_threads / sh.threads, kMaxGroups) : 1;
    if (o.smem > 0) groups = std::min(groups, cta_smem / o.smem);
    if (o.smem > 0 && place.smem_cap > 0) groups = std::max(1, std::min(groups, place.smem_cap / o.smem));
    o.groups = uint8_t(std::max(groups, 1));
    if (o.smem > cta_smem)
      refuse(fmt::format("layer {} op {}: {} B of shared memory, the CTA has {}", c.layer, c.name, o.smem, cta_smem));
    o.items = sh.items;
    o.layer = c.layer;
    o.wait_op = int32_t(i) - 1;
    if (sh.threads > cta_threads)
      refuse(fmt::format("layer {} op {}: a group of {} threads, the CTA has {}", c.layer, c.name, sh.threads,
                         cta_threads));
    if (sh.items <= 0 || sh.items > INT32_MAX)
      refuse(fmt::format("layer {} op {}: {} work items", c.layer, c.name, sh.items));
    std::visit(
        [&](const auto& p) {
          static_assert(sizeof(p) <= kParamBytes, "op params larger than a MonoOp holds");
          std::memcpy(o.params, &p, sizeof(p));
        },
        c.params);
    o.first_task = int32_t(total);
    total += sh.items;
    t.max_threads = std::max(t.max_threads, o.threads);
    t.max_smem = std::max(t.max_smem, o.smem * int(o.groups));
    t.ops.push_back(o);
  }
  if (why && why->size() > refused) return {};
  if (place.early)
    for (size_t i = 1; i + 1 < t.ops.size(); ++i) {
      const auto* sp = std::get_if<kernels::MoeSplitParams>(&ops[i].params);
      if (!sp || !std::holds_alternative<kernels::MoeMmaParams>(ops[i + 1].params)) continue;
      // router GEMV, route, split, gate/up; or the router GEMV that routes, split, gate/up
      const auto* rp = i >= 2 ? std::get_if<kernels::GemvParams>(&ops[i - 2].params) : nullptr;
      const auto* fp = std::get_if<kernels::RouterGemvRouteParams>(&ops[i - 1].params);
      if (rp && t.ops[i - 1].code == uint8_t(OpCode::MoeRoute) && rp->x == sp->x) {
        t.ops[i].wait_op = t.ops[i - 2].wait_op;  // the router's input: the norm
        t.ops[i + 1].wait_op2 = int32_t(i - 1);   // gate/up: the split (wait_op) and the routing
      } else if (fp && fp->gemv.x == sp->x) {
        t.ops[i].wait_op = t.ops[i - 1].wait_op;  // the router's input: the norm
        t.ops[i + 1].wait_op2 = int32_t(i - 1);   // gate/up: the split and the router that routes
      }
    }
  for (MonoOp& o : t.ops) {
    o.wait_items = o.wait_op >= 0 ? int32_t(t.ops[size_t(o.wait_op)].items) : 0;
    o.wait_items2 = o.wait_op2 >= 0 ? int32_t(t.ops[size_t(o.wait_op2)].items) : 0;
  }
  if (total > INT32_MAX) {
    refuse(fmt::format("mono: {} tasks", total));
    return {};
  }
  // placement (TablePlacement); each CTA's list stays in the global order
  if (place.reserve < 0 || place.reserve >= grid || place.small < 0) {
    refuse(fmt::format("mono: {} of {} CTAs reserved for ops of at most {} items", place.reserve, grid, place.small));
    return {};
  }
  const int wide = grid - place.reserve;
  std::vector<std::vector<MonoTask>> per(static_cast<size_t>(grid));
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const MonoOp& o = t.ops[i];
    const bool small = place.reserve > 0 && o.items <= place.small;
    for (int64_t w = 0; w < o.items; ++w) {
      int64_t c;
      if (small) c = wide + (int64_t(o.code) + w) % place.reserve;
      else if (place.pin) c = (int64_t(o.code) * 8 + w) % wide;  // op codes 8 CTAs apart
      else c = (o.first_task + w) % wide;
      per[size_t(c)].push_back(MonoTask{int32_t(i), int32_t(w)});
    }
  }
  t.grid = grid;
  t.cta_begin.push_back(0);
  for (auto& l : per) {
    t.tasks.insert(t.tasks.end(), l.begin(), l.end());
    t.cta_begin.push_back(int32_t(t.tasks.size()));
  }
  return t;
}

std::string check_task_order(const TaskTable& t) {
  if (t.cta_begin.size() != size_t(t.grid) + 1) return "cta_begin does not cover the grid";
  std::vector<int64_t> seen(t.ops.size(), 0);
  for (int c = 0; c < t.grid; ++c) {
    int64_t prev = -1;
    for (int32_t i = t.cta_begin[size_t(c)]; i < t.cta_begin[size_t(c + 1)]; ++i) {
      const MonoTask& k = t.tasks[size_t(i)];
      if (k.op < 0 || size_t(k.op) >= t.ops.size()) return fmt::format("CTA {} task {}: op {} out of range", c, i, k.op);
      const MonoOp& o = t.ops[size_t(k.op)];
      if (k.item < 0 || k.item >= o.items) return fmt::format("CTA {} task {}: item {} of {}", c, i, k.item, o.items);
      const int64_t g = int64_t(o.first_task) + k.item;
      if (g <= prev) return fmt::format("CTA {}: task {} (global {}) after global {}", c, i, g, prev);
      prev = g;
      if (o.wait_op >= k.op) return fmt::format("op {} waits for op {}, not an earlier one", k.op, o.wait_op);
      if (o.wait_op2 >= k.op || (o.wait_op2 >= 0 && t.ops[size_t(o.wait_op2)].items <= 0))
        return fmt::format("op {} waits for op {} too, not an earlier one with items", k.op, o.wait_op2);
      if (o.stage_wait >= k.op || (o.stage == 2) != (o.stage_wait >= 0))
        return fmt::format("op {} (stage {}) stages after op {}, not an earlier one", k.op, o.stage, o.stage_wait);
      if (o.wait_op >= 0 && t.ops[size_t(o.wait_op)].items <= 0)
        return fmt::format("op {} waits for op {}, which has no items", k.op, o.wait_op);
      if (o.wait_items != (o.wait_op >= 0 ? t.ops[size_t(o.wait_op)].items : 0) ||
          o.wait_items2 != (o.wait_op2 >= 0 ? t.ops[size_t(o.wait_op2)].items : 0))
        return fmt::format("op {}: wait targets {} / {} are not the items of ops {} / {}", k.op, o.wait_items,
                           o.wait_items2, o.wait_op, o.wait_op2);
      ++seen[size_t(k.op)];
    }
  }
  for (size_t i = 0; i < t.ops.size(); ++i)
    if (seen[i] != t.ops[i].items) return fmt::format("op {}: {} of {} items assigned", i, seen[i], t.ops[i].items);
  return "";
}

}  // namespace m3::mono
