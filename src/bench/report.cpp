// Table and JSON renderings of a benchmark run (report.h).
#include "bench/report.h"

#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <fstream>

#include "core/check.h"

namespace m3::bench {

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string this_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  if (!f) return "";
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out;
  bool first = true;
  for (size_t b = 0; b < all.size();) {
    size_t e = all.find('\0', b);
    if (e == std::string::npos) e = all.size();
    std::string arg = all.substr(b, e - b);
    if (first) {  // the binary's base name
      auto s = arg.rfind('/');
      if (s != std::string::npos) arg = arg.substr(s + 1);
    }
    out += (first ? "" : " ") + arg;
    first = false;
    b = e + 1;
  }
  return out;
}

namespace {

bool has(double v) { return std::isfinite(v); }
std::string num(double v, int prec = 1) { return has(v) ? fmt::format("{:.{}f}", v, prec) : "-"; }
std::string pct(double v) { return has(v) ? fmt::format("{:.0f}%", 100 * v) : "-"; }
nlohmann::json jnum(double v) { return has(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

void print_ops(const PathResult& p, std::FILE* out) {
  bool timed = false;
  for (const auto& o : p.ops) timed = timed || has(o.us);
  if (!timed) return;
  std::fprintf(out, "    %-14s %5s %9s %9s %9s %7s %9s %8s %7s\n", "op", "count", "MB", "floor us", "us", "%step",
               "read us", "us/read", "GB/s");
  for (const auto& o : p.ops)
    std::fprintf(out, "    %-14s %5d %9.2f %9.1f %9s %7s %9s %8s %7s\n", o.op.c_str(), o.count, o.bytes / 1e6,
                 o.floor_us, num(o.us).c_str(), pct(o.us / p.us.median).c_str(), num(o.read_us).c_str(),
                 has(o.read_us) && has(o.us) ? fmt::format("{:.2f}", o.us / o.read_us).c_str() : "-",
                 has(o.us) && o.us > 0 ? fmt::format("{:.0f}", o.bytes / o.us / 1e3).c_str() : "-");
  std::string tail = fmt::format("    kernels {}", p.kernels >= 0 ? std::to_string(p.kernels) : "-");
  if (has(p.gap_us)) tail += fmt::format(", est. kernel-boundary time {:.1f} us (kernels x boundary)", p.gap_us);
  std::fprintf(out, "%s\n", tail.c_str());
}

}  // namespace

void print_report(const BenchReport& r, std::FILE* out) {
  std::fprintf(out, "%s\n", fmt::format("m3mono bench ({}) {} | {} | commit {}", r.mode, r.date, r.device, r.commit).c_str());
  std::fprintf(out, "%s\n", fmt::format("model {}: {} layers, tp-shard {}, kv {}, index-K {}; warm-up {}, {} steps",
                                        r.model, r.layers, r.tp_shard, r.kv_dtype, r.ik_dtype, r.warmup, r.steps)
                                .c_str());
  std::string bw = fmt::format("floor bandwidth {:.0f} GB/s ({})", r.copy_GBps, r.copy_method);
  if (has(r.read_GBps)) bw += fmt::format("; streaming read {:.0f} GB/s", r.read_GBps);
  if (has(r.boundary_us)) bw += fmt::format("; kernel boundary in a graph {:.2f} us", r.boundary_us);
  std::fprintf(out, "%s\n", bw.c_str());
  for (const auto& n : r.notes) std::fprintf(out, "note: %s\n", n.c_str());

  if (!r.cases.empty()) {
    std::fprintf(out, "\n%-22s %-9s %10s %10s %10s %7s %10s %10s %9s\n", "case", "path", "median us", "p90 us",
                 "floor us", "floor%", "MB read", "tokens/s", "TFLOP/s");
    for (const auto& c : r.cases)
      for (const auto& p : c.paths) {
        const double tok = double(c.c.tokens()) / (p.us.median * 1e-6);
        // a plain read computes nothing: no FLOP rate for the stream path
        const double tf = p.path == "stream" ? NAN : c.bytes.flops / p.us.median / 1e6;
        std::fprintf(out, "%-22s %-9s %10.1f %10.1f %10.1f %7s %10.2f %10.0f %9s\n", c.c.label().c_str(),
                     p.path.c_str(), p.us.median, p.us.p90, c.floor_us, pct(c.floor_us / p.us.median).c_str(),
                     c.bytes.total / 1e6, tok, num(tf).c_str());
        if (c.c.is_prefill() && p.path != "stream" && std::isfinite(c.flop_floor_us) && c.flop_floor_us > 0)
          std::fprintf(out, "    FLOP floor %.1f us (%.3g TFLOP at %.0f TFLOP/s): %s of it\n", c.flop_floor_us,
                       c.bytes.flops / 1e12, r.tc_peak_tflops, pct(c.flop_floor_us / p.us.median).c_str());
        if (!p.note.empty()) std::fprintf(out, "    (%s)\n", p.note.c_str());
        print_ops(p, out);
      }
    bool ratios = false;
    for (const auto& c : r.cases) ratios = ratios || c.paths.size() > 1;
    if (ratios) {
      std::fprintf(out, "\nratios (median / first path's median):\n");
      for (const auto& c : r.cases)
        for (size_t i = 1; i < c.paths.size(); ++i)
          std::fprintf(out, "  %-22s %s / %s = %.3f\n", c.c.label().c_str(), c.paths[i].path.c_str(),
                       c.paths[0].path.c_str(), c.paths[i].us.median / c.paths[0].us.median);
    }
  }
  if (!r.kernels.empty()) {
    std::fprintf(out, "\n%-14s %-36s %4s %9s %9s %9s %8s %10s %9s %8s\n", "kernel", "shape", "M", "MB", "us", "read us",
                 "read/us", "cublasLt", "cublas/us", "GB/s");
    for (const auto& k : r.kernels)
      std::fprintf(out, "%-14s %-36s %4d %9.2f %9.2f %9.2f %7.0f%% %10s %9s %8.0f\n", k.kernel.c_str(),
                   k.shape.c_str(), k.M, k.bytes / 1e6, k.us, k.read_us, 100 * k.read_us / k.us,
                   num(k.cublas_us, 2).c_str(), has(k.cublas_us) ? fmt::format("{:.2f}", k.cublas_us / k.us).c_str() : "-",
                   k.bytes / k.us / 1e3);
    for (const auto& k : r.kernels)
      if (!k.cublas_note.empty()) {
        std::fprintf(out, "cuBLASLt: %s\n", k.cublas_note.c_str());
        break;
      }
  }
}

nlohmann::json report_json(const BenchReport& r) {
  using nlohmann::json;
  json j;
  j["schema"] = r.schema;
  j["date"] = r.date;
  j["device"] = r.device;
  j["commit"] = r.commit;
  j["command"] = r.command;
  j["mode"] = r.mode;
  j["model"] = {{"name", r.model}, {"layers", r.layers}, {"tp_shard", r.tp_shard}, {"kv_dtype", r.kv_dtype},
                {"ik_dtype", r.ik_dtype}};
  j["timing"] = {{"warmup", r.warmup}, {"steps", r.steps}, {"unit", "us"}, {"p90", "nearest rank"}};
  j["bandwidth"] = {{"copy_GBps", r.copy_GBps}, {"copy_method", r.copy_method}, {"read_GBps", jnum(r.read_GBps)},
                    {"boundary_us", jnum(r.boundary_us)}};
  j["tc_peak_tflops"] = r.tc_peak_tflops;
  j["tc_peak_source"] = r.tc_peak_source;
  j["notes"] = r.notes;
  json cases = json::array();
  for (const auto& c : r.cases) {
    json jc;
    jc["mode"] = c.c.mode();
    jc["label"] = c.c.label();
    jc["batch"] = c.c.batch;
    jc["query"] = c.c.query;
    jc["context"] = c.c.context;
    jc["prefill"] = c.c.prefill;
    jc["tokens"] = c.c.tokens();
    json ops = json::array();
    for (const auto& o : c.bytes.ops) ops.push_back({{"op", o.op}, {"count", o.count}, {"bytes", o.bytes}, {"flops", o.flops}});
    jc["bytes"] = {{"total", c.bytes.total}, {"weights", c.bytes.weights}, {"experts", c.bytes.experts},
                   {"cache", c.bytes.cache}, {"kv", c.bytes.kv}, {"index_k", c.bytes.index_k},
                   {"lm_head", c.bytes.lm_head}, {"experts_hit_per_layer", c.bytes.experts_hit_mean},
                   {"expert_model", c.bytes.expert_model}, {"ops", ops}};
    jc["flops"] = c.bytes.flops;
    jc["floor_us"] = c.floor_us;
    jc["flop_floor_us"] = jnum(c.flop_floor_us);
    json paths = json::array();
    for (const auto& p : c.paths) {
      json jp;
      jp["path"] = p.path;
      jp["median_us"] = p.us.median;
      jp["p90_us"] = p.us.p90;
      jp["mean_us"] = p.us.mean;
      jp["min_us"] = p.us.min;
      jp["max_us"] = p.us.max;
      jp["samples"] = p.us.n;
      jp["achieved_fraction"] = c.floor_us / p.us.median;
      jp["tokens_per_s"] = double(c.c.tokens()) / (p.us.median * 1e-6);
      const bool computes = p.path != "stream";  // a plain read computes nothing
      jp["tflops"] = computes ? jnum(c.bytes.flops / p.us.median / 1e6) : json(nullptr);
      jp["tc_fraction"] = computes && r.tc_peak_tflops > 0 ? jnum(c.bytes.flops / p.us.median / 1e6 / r.tc_peak_tflops)
                                                         : json(nullptr);
      jp["path_bytes"] = p.path_bytes > 0 ? json(p.path_bytes) : json(nullptr);
      jp["kernels"] = p.kernels >= 0 ? json(p.kernels) : json(nullptr);
      jp["gap_us"] = jnum(p.gap_us);
      jp["ratio_to_first"] = p.us.median / c.paths.front().us.median;
      jp["note"] = p.note;
      json pops = json::array();
      for (const auto& o : p.ops)
        pops.push_back({{"op", o.op}, {"count", o.count}, {"bytes", o.bytes}, {"floor_us", o.floor_us},
                        {"us", jnum(o.us)}, {"read_us", jnum(o.read_us)},
                        {"kernels", o.kernels >= 0 ? json(o.kernels) : json(nullptr)}});
      jp["ops"] = pops;
      paths.push_back(jp);
    }
    jc["paths"] = paths;
    cases.push_back(jc);
  }
  j["cases"] = cases;
  json ks = json::array();
  for (const auto& k : r.kernels)
    ks.push_back({{"kernel", k.kernel}, {"shape", k.shape}, {"M", k.M}, {"bytes", k.bytes}, {"us", k.us},
                  {"read_us", k.read_us}, {"read_fraction", k.read_us / k.us}, {"cublas_us", jnum(k.cublas_us)},
                  {"cublas_ratio", jnum(k.cublas_us / k.us)}, {"cublas_note", k.cublas_note}, {"flops", k.flops},
                  {"GBps", k.bytes / k.us / 1e3}});
  j["kernels"] = ks;
  return j;
}

void write_report_json(const BenchReport& r, const std::string& path) {
  std::ofstream f(path);
  M3_CHECK(bool(f), "bench: cannot write --json file '{}'", path);
  f << report_json(r).dump(2) << "\n";
  M3_CHECK(bool(f), "bench: writing --json file '{}' failed", path);
}

}  // namespace m3::bench
