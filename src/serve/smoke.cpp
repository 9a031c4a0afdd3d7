// The smoke / soak client: cases, one request (JSON or SSE), checks, concurrency levels, table.
#include "serve/smoke.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "serve/completion_api.h"

namespace m3::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double metric_value(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ')
      return std::strtod(line.c_str() + name.size() + 1, nullptr);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

namespace {

struct Case {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  bool sampled = false;
  uint64_t seed = 0;
};

struct Outcome {
  bool ok = false;
  bool abandoned = false;  // the client disconnected on purpose
  std::string error;
  std::vector<int32_t> ids;
  double latency_s = 0;
};

struct Client {
  const SmokeOptions& opt;
  std::string model;
  httplib::Client http;
  Client(const SmokeOptions& o, std::string m) : opt(o), model(std::move(m)), http(o.url) {
    auto t = std::chrono::duration<double>(o.timeout_s);
    http.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    http.set_write_timeout(std::chrono::seconds(10));
    http.set_connection_timeout(std::chrono::seconds(5));
    http.set_keep_alive(true);
  }
  httplib::Headers headers() const {
    httplib::Headers h;
    if (!opt.api_key.empty()) h.emplace("Authorization", "Bearer " + opt.api_key);
    return h;
  }

  std::string body(const Case& c, bool stream) const {
    // skip_special_tokens false: with a tokenizer, text is then exactly /detokenize of token_ids
    json j = {{"model", model}, {"prompt", c.prompt}, {"max_tokens", c.max_tokens}, {"ignore_eos", true},
              {"skip_special_tokens", false}};
    if (c.sampled) {
      j["temperature"] = 0.8;
      j["top_p"] = 0.95;
      j["seed"] = c.seed;
    } else {
      j["temperature"] = 0;
    }
    if (stream) {
      j["stream"] = true;
      j["stream_options"] = {{"include_usage", true}};
    }
    return j.dump();
  }

  // The server's /detokenize of `ids`, or nullopt when it has no tokenizer (or fails).
  std::optional<std::string> detokenize(const std::vector<int32_t>& ids) {
    auto res = http.Post("/detokenize", headers(), json{{"tokens", ids}}.dump(), "application/json");
    if (!res || res->status != 200) return std::nullopt;
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("prompt") || !j["prompt"].is_string()) return std::nullopt;
    return j["prompt"].get<std::string>();
  }

  // Checks one choice + usage against the case; returns "" or what is wrong. The text spells the
  // ids (a server without a tokenizer) or is their decoded text (one with).
  std::string check(const Case& c, const std::vector<int32_t>& ids, const std::string& text, const json& finish,
                    const json& usage) {
    if (int(ids.size()) != c.max_tokens)
      return fmt::format("got {} tokens, asked for {} (ignore_eos)", ids.size(), c.max_tokens);
    if (text != ids_text(ids)) {
      std::optional<std::string> d = detokenize(ids);
      if (!d) return fmt::format("text '{}' does not spell token_ids (and /detokenize is not served)", text.substr(0, 80));
      if (text != *d) return fmt::format("text '{}' is not the decoded token_ids '{}'", text.substr(0, 80), d->substr(0, 80));
    }
    if (finish != "length") return fmt::format("finish_reason {} (expected \"length\")", finish.dump());
    if (!usage.is_object()) return "no usage";
    if (usage.value("prompt_tokens", -1) != int(c.prompt.size()) || usage.value("completion_tokens", -1) != c.max_tokens ||
        usage.value("total_tokens", -1) != int(c.prompt.size()) + c.max_tokens)
      return fmt::format("usage {} does not match prompt {} + completion {}", usage.dump(), c.prompt.size(), c.max_tokens);
    return "";
  }

  Outcome run(const Case& c, bool stream, int abandon_after = 0) {
    Outcome o;
    auto t0 = Clock::now();
    try {
      o.error = stream ? run_stream(c, o, abandon_after) : run_whole(c, o);
    } catch (const std::exception& e) {
      o.error = std::string("client error: ") + e.what();
    }
    o.latency_s = std::chrono::duration<double>(Clock::now() - t0).count();
    o.ok = o.error.empty() && !o.abandoned;
    return o;
  }

  std::string run_whole(const Case& c, Outcome& o) {
    auto res = http.Post("/v1/completions", headers(), body(c, false), "application/json");
    if (!res) return "HTTP failure: " + httplib::to_string(res.error());
    if (res->status != 200) return fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 300));
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("choices") || j["choices"].size() != 1) return "malformed response: " + res->body.substr(0, 300);
    const json& ch = j["choices"][0];
    o.ids = ch.value("token_ids", std::vector<int32_t>{});
    return check(c, o.ids, ch.value("text", std::string("?")), ch["finish_reason"], j["usage"]);
  }

  std::string run_stream(const Case& c, Outcome& o, int abandon_after) {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = headers();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    req.body = body(c, true);
    std::string buf, text, problem;
    json finish = nullptr, usage = nullptr;
    bool done = false, after_done = false;
    int chunks_after_finish = 0;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) -> bool {
      buf.append(data, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        std::string ev = buf.substr(0, pos);
        buf.erase(0, pos + 2);
        if (ev.empty() || ev[0] == ':') continue;  // SSE comment (keep-alive)
        if (ev.rfind("data: ", 0) != 0) {
          problem = "SSE event without 'data: ': " + ev.substr(0, 80);
          continue;
        }
        std::string d = ev.substr(6);
        if (done) after_done = true;
        if (d == "[DONE]") {
          done = true;
          continue;
        }
        json j = json::parse(d, nullptr, false);
        if (j.is_discarded()) {
          problem = "SSE data is not JSON: " + d.substr(0, 80);
          continue;
        }
        if (j.contains("error")) {
          problem = "stream error: " + j["error"].dump();
          continue;
        }
        if (j.contains("usage") && !j["usage"].is_null()) usage = j["usage"];
        for (const auto& ch : j.value("choices", json::array())) {
          if (!finish.is_null()) chunks_after_finish++;
          auto ids = ch.value("token_ids", std::vector<int32_t>{});
          o.ids.insert(o.ids.end(), ids.begin(), ids.end());
          text += ch.value("text", std::string());
          if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
        }
        if (abandon_after > 0 && int(o.ids.size()) >= abandon_after) {
          o.abandoned = true;
          return false;  // hang up mid-stream
        }
      }
      return true;
    };
    auto res = http.send(req);
    if (o.abandoned) return "";
    if (!res) return "HTTP failure: " + httplib::to_string(res.error());
    if (res->status != 200) return fmt::format("HTTP {}: {}", res->status, (res->body + buf).substr(0, 300));
    if (!problem.empty()) return problem;
    if (!done) return "stream ended without [DONE] (truncated)";
    if (after_done) return "events after [DONE]";
    if (chunks_after_finish) return "choice chunks after finish_reason";
    return check(c, o.ids, text, finish, usage);
  }
};

struct LevelResult {
  std::string label;
  int requests = 0, ok = 0, failed = 0, mismatches = 0, abandoned = 0;
  std::vector<double> latencies;
  long tokens = 0;
  double wall_s = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(std::ceil(q * double(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int run_smoke(const SmokeOptions& opt, std::ostream& out) {
  uint64_t seed = opt.seed ? opt.seed : std::random_device{}();
  std::mt19937_64 rng(seed);
  out << fmt::format("smoke: {} seed {}\n", opt.url, seed);

  // The model and its limits.
  std::string model = opt.model;
  int vocab = 0, max_len = 0;
  {
    Client probe(opt, "");
    auto res = probe.http.Get("/v1/models", probe.headers());
    if (!res || res->status != 200) {
      out << "smoke: cannot list models at " << opt.url << ": "
          << (res ? fmt::format("HTTP {} {}", res->status, res->body) : httplib::to_string(res.error())) << "\n";
      return 2;
    }
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || j["data"].empty()) {
      out << "smoke: /v1/models lists no model: " << res->body << "\n";
      return 2;
    }
    const json* m = &j["data"][0];
    for (const auto& d : j["data"])
      if (!model.empty() && d.value("id", "") == model) m = &d;
    if (model.empty()) model = m->value("id", "");
    vocab = m->value("vocab_size", 0);
    max_len = m->value("max_model_len", 0);
    if (vocab <= 0 || max_len <= 1) {
      out << "smoke: /v1/models gives no vocab_size / max_model_len for " << model << "\n";
      return 2;
    }
  }

  // Distinct cases.
  std::vector<Case> cases(size_t(std::max(1, opt.distinct)));
  int hi_tokens = std::max(1, std::min(opt.max_tokens, max_len / 2));
  int hi_prompt = std::max(1, std::min(opt.max_prompt, max_len - hi_tokens));
  int lo_prompt = std::clamp(opt.min_prompt, 1, hi_prompt);
  for (auto& c : cases) {
    int len = std::uniform_int_distribution<int>(lo_prompt, hi_prompt)(rng);
    for (int i = 0; i < len; ++i) c.prompt.push_back(std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng));
    c.max_tokens = std::uniform_int_distribution<int>(std::max(1, hi_tokens / 2), hi_tokens)(rng);
    c.sampled = std::uniform_real_distribution<double>(0, 1)(rng) < opt.sampled_fraction;
    c.seed = rng() >> 1;
  }
  out << fmt::format("smoke: model {} (vocab {}, context {}), {} cases, prompts {}..{} tokens, up to {} new tokens\n",
                     model, vocab, max_len, cases.size(), lo_prompt, hi_prompt, hi_tokens);

  std::vector<std::vector<int32_t>> reference(cases.size());
  std::vector<std::string> failures;
  std::mutex mu;

  // Runs `n` requests at concurrency `c`; `pick(k)` gives (case index, stream, abandon_after).
  auto run_level = [&](const std::string& label, int c, int n, auto pick, bool is_reference) {
    LevelResult r;
    r.label = label;
    std::atomic<int> next{0};
    auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < c; ++w)
      workers.emplace_back([&] {
        Client cl(opt, model);
        for (int k; (k = next++) < n;) {
          auto [ci, stream, abandon] = pick(k);
          Outcome o = cl.run(cases[size_t(ci)], stream, abandon);
          std::lock_guard lk(mu);
          r.requests++;
          if (o.abandoned) {
            r.abandoned++;
            continue;
          }
          r.latencies.push_back(o.latency_s);
          if (!o.ok) {
            r.failed++;
            if (failures.size() < 20) failures.push_back(fmt::format("[{}] case {}{}: {}", label, ci, stream ? " (stream)" : "", o.error));
            continue;
          }
          r.ok++;
          r.tokens += long(o.ids.size());
          if (is_reference) {
            reference[size_t(ci)] = o.ids;
          } else if (o.ids != reference[size_t(ci)]) {
            r.mismatches++;
            if (failures.size() < 20)
              failures.push_back(fmt::format("[{}] case {}{}: output {} differs from the single-request run {}", label, ci,
                                             stream ? " (stream)" : "", ids_text(o.ids), ids_text(reference[size_t(ci)])));
          }
        }
      });
    for (auto& t : workers) t.join();
    r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  };

  std::vector<LevelResult> rows;
  const int ncases = int(cases.size());
  rows.push_back(run_level("ref", 1, ncases, [](int k) { return std::tuple<int, bool, int>(k, false, 0); }, true));
  for (int c : opt.concurrency) {
    int offset = std::uniform_int_distribution<int>(0, ncases - 1)(rng);
    double sf = opt.stream_fraction;
    rows.push_back(run_level(
        fmt::format("c={}", c), c, opt.requests,
        [=](int k) {
          // streaming on a fixed share of requests, spread evenly over the level
          bool stream = std::floor((k + 1) * sf) != std::floor(k * sf);
          return std::tuple<int, bool, int>((k + offset) % ncases, stream, 0);
        },
        false));
  }
  if (opt.duration_s > 0) {
    LevelResult soak;
    soak.label = "soak";
    auto end = Clock::now() + std::chrono::duration<double>(opt.duration_s);
    while (Clock::now() < end) {
      int c = opt.concurrency[std::uniform_int_distribution<size_t>(0, opt.concurrency.size() - 1)(rng)];
      uint64_t salt = rng();
      double sf = opt.stream_fraction, df = opt.disconnect_fraction;
      LevelResult r = run_level(
          "soak", c, 2 * c,
          [=](int k) {
            std::mt19937_64 g(salt + uint64_t(k));
            std::uniform_real_distribution<double> u(0, 1);
            bool stream = u(g) < sf;
            int abandon = stream && u(g) < df ? 1 : 0;
            return std::tuple<int, bool, int>(int(g() % uint64_t(ncases)), stream || abandon, abandon);
          },
          false);
      soak.requests += r.requests;
      soak.ok += r.ok;
      soak.failed += r.failed;
      soak.mismatches += r.mismatches;
      soak.abandoned += r.abandoned;
      soak.tokens += r.tokens;
      soak.wall_s += r.wall_s;
      soak.latencies.insert(soak.latencies.end(), r.latencies.begin(), r.latencies.end());
    }
    rows.push_back(soak);
  }

  out << fmt::format("{:>6} {:>9} {:>6} {:>7} {:>11} {:>10} {:>10} {:>10} {:>9}\n", "level", "requests", "ok", "failed",
                     "mismatches", "p50 ms", "p90 ms", "tokens/s", "hung up");
  int bad = 0;
  for (const auto& r : rows) {
    out << fmt::format("{:>6} {:>9} {:>6} {:>7} {:>11} {:>10.1f} {:>10.1f} {:>10.1f} {:>9}\n", r.label, r.requests, r.ok,
                       r.failed, r.mismatches, 1000 * percentile(r.latencies, 0.5), 1000 * percentile(r.latencies, 0.9),
                       r.wall_s > 0 ? double(r.tokens) / r.wall_s : 0.0, r.abandoned);
    bad += r.failed + r.mismatches;
  }

  // Nothing may be left behind: every block back in the pool, nothing queued or running.
  {
    Client cl(opt, model);
    std::string page;
    double used = NAN, running = NAN, queued = NAN;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    do {
      auto res = cl.http.Get("/metrics", cl.headers());
      if (res && res->status == 200) {
        page = res->body;
        used = metric_value(page, "m3_cache_blocks_used");
        running = metric_value(page, "m3_requests_running");
        queued = metric_value(page, "m3_queue_depth");
        if (used == 0 && running == 0 && queued == 0) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (Clock::now() < deadline);
    out << fmt::format("after the run: cache blocks used {}, running {}, queued {}, preemptions {}\n", used, running,
                       queued, metric_value(page, "m3_preemptions_total"));
    if (!(used == 0 && running == 0 && queued == 0)) {
      failures.push_back("the server did not return to idle: cache blocks used / running / queued are not all 0");
      bad++;
    }
  }
  for (const auto& f : failures) out << "FAIL " << f << "\n";
  out << (bad ? "smoke: FAILED\n" : "smoke: ok\n");
  out.flush();
  return bad ? 1 : 0;
}

}  // namespace m3::serve
