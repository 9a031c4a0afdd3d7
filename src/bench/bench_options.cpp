// bench_spec(): preset or config.json, then --layers, then --tp-shard (bench_options.h).
#include "bench/bench_options.h"

#include "bench/bench_case.h"
#include "core/check.h"
#include "model/config.h"
#include "model/synthetic.h"

namespace m3::bench {

ModelSpec bench_spec(const BenchOptions& o, std::string* name) {
  M3_CHECK(o.preset.empty() || o.config.empty(), "bench: give --preset or --config, not both");
  ModelSpec s;
  std::string n;
  if (!o.config.empty()) {
    s = load_model_spec(o.config);
    n = o.config;
  } else {
    n = o.preset.empty() ? (o.device == "cpu" ? "tiny" : "real") : o.preset;
    s = synthetic_preset(n);
  }
  if (o.layers > 0) s = last_layers(s, o.layers);
  s = shard_spec(s, o.tp_shard);
  if (name) *name = n;
  return s;
}

}  // namespace m3::bench
