// `m3mono smoke --url URL`: drives a running `m3mono serve` at several concurrencies (and
// optionally soaks it), checks every response and prints a table (serve/smoke.h).
#include <signal.h>

#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "core/check.h"
#include "serve/smoke.h"

namespace m3::cli {
namespace {

M3_COMMAND(
    "smoke", "Drive a running server at several concurrencies, check every answer, print a table",
    [](CLI::App& app) -> RunFn {
      auto o = std::make_shared<serve::SmokeOptions>();
      auto conc = std::make_shared<std::string>("8,5,4,2,1");
      app.add_option("--url", o->url, "Server base URL")->capture_default_str();
      app.add_option("--api-key", o->api_key, "Bearer token (default: $M3_API_KEY if set)");
      app.add_option("--model", o->model, "Model id (default: the first one /v1/models lists)");
      app.add_option("--concurrency", *conc, "Concurrency levels, run in this order")->capture_default_str();
      app.add_option("--requests", o->requests, "Requests per level")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--distinct", o->distinct, "Distinct prompts")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--max-tokens", o->max_tokens, "Largest max_tokens per request")->capture_default_str()
          ->check(CLI::PositiveNumber);
      app.add_option("--min-prompt", o->min_prompt, "Shortest prompt")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--max-prompt", o->max_prompt, "Longest prompt")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--stream-fraction", o->stream_fraction, "Share of streamed requests")->capture_default_str()
          ->check(CLI::Range(0.0, 1.0));
      app.add_option("--sampled-fraction", o->sampled_fraction, "Share of prompts using seeded sampling")
          ->capture_default_str()->check(CLI::Range(0.0, 1.0));
      app.add_option("--duration", o->duration_s, "Soak for this many seconds after the levels (0 = no soak)")
          ->capture_default_str();
      app.add_option("--disconnect-fraction", o->disconnect_fraction, "Soak: share of streams abandoned mid-way")
          ->capture_default_str()->check(CLI::Range(0.0, 1.0));
      app.add_option("--timeout", o->timeout_s, "Seconds per HTTP request")->capture_default_str();
      app.add_option("--seed", o->seed, "Seed of prompts and choices (0 = random)")->capture_default_str();
      return [o, conc] {
        signal(SIGPIPE, SIG_IGN);
        if (o->api_key.empty())
          if (const char* k = std::getenv("M3_API_KEY")) o->api_key = k;
        o->concurrency.clear();
        std::stringstream ss(*conc);
        for (std::string tok; std::getline(ss, tok, ',');) {
          int c = 0;
          try {
            c = std::stoi(tok);
          } catch (const std::exception&) {
            M3_FAIL("smoke: --concurrency entry '{}' is not a number", tok);
          }
          M3_CHECK(c >= 1, "smoke: --concurrency entry {} must be >= 1", c);
          o->concurrency.push_back(c);
        }
        M3_CHECK(!o->concurrency.empty(), "smoke: --concurrency is empty");
        return serve::run_smoke(*o, std::cout);
      };
    },
    31);

}  // namespace
}  // namespace m3::cli
