// summarize_trace (mono/mono.h): plain C++, so the CPU tests check it.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "mono/mono.h"

namespace m3::mono {

std::string summarize_trace(const std::vector<TaskTrace>& tr) {
  struct Acc {
    int64_t tasks = 0, ops = 0;
    double wait = 0, run = 0, span = 0;
  };
  std::map<std::string, Acc> by;
  std::map<int, std::pair<double, double>> op_span;  // op -> (first run begin, last end)
  std::map<int, std::string> op_code_of;
  double end = 0;
  for (const TaskTrace& t : tr) {
    Acc& a = by[t.code];
    ++a.tasks;
    a.wait += t.run_begin - t.wait_begin;
    a.run += t.end - t.run_begin;
    auto [it, fresh] = op_span.try_emplace(t.op, t.run_begin, t.end);
    if (!fresh) it->second = {std::min(it->second.first, t.run_begin), std::max(it->second.second, t.end)};
    op_code_of[t.op] = t.code;
    end = std::max(end, t.end);
  }
  // hop: an op's first item start after the previous op's (in the plan) last item end; an op that
  // runs beside its predecessor (the MoE split) counts a negative hop
  std::map<std::string, std::pair<double, int64_t>> hop;  // code -> (sum, ops)
  double hops = 0;
  const std::pair<double, double>* prev = nullptr;
  for (const auto& [op, sp] : op_span) {
    by[op_code_of[op]].span += sp.second - sp.first;
    ++by[op_code_of[op]].ops;
    if (prev) {
      auto& h = hop[op_code_of[op]];
      h.first += sp.first - prev->second;
      ++h.second;
      hops += sp.first - prev->second;
    }
    prev = &sp;
  }
  std::string s =
      fmt::format("mono trace: {} tasks, launch {:.1f} us\n  {:<22} {:>6} {:>8} {:>12} {:>12} {:>12} {:>10}\n",
                  tr.size(), end / 1e3, "op", "ops", "tasks", "wait us/task", "run us/task", "span us", "hop us/op");
  for (const auto& [code, a] : by) {
    const auto h = hop.find(code);  // absent only for the first op's code when no later op has it
    const double per = h == hop.end() ? 0 : h->second.first / 1e3 / double(h->second.second);
    s += fmt::format("  {:<22} {:>6} {:>8} {:>12.2f} {:>12.2f} {:>12.1f} {:>10.2f}\n", code, a.ops, a.tasks,
                     a.wait / 1e3 / double(a.tasks), a.run / 1e3 / double(a.tasks), a.span / 1e3, per);
  }
  s += fmt::format("  hops in all: {:.1f} us over {} ops\n", hops / 1e3, op_span.size() > 0 ? op_span.size() - 1 : 0);
  return s;
}

}  // namespace m3::mono
