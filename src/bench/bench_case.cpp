// Benchmark cases, count parsing and the shard / layer-cut specs (bench_case.h).
#include "bench/bench_case.h"

#include <fmt/format.h>

#include <cctype>
#include <limits>

#include "core/check.h"
#include "model/tp_shard.h"

namespace m3::bench {

std::string BenchCase::label() const {
  if (is_prefill()) return fmt::format("prefill T={}", format_count(prefill));
  if (query > 1) return fmt::format("decode b={} q={} ctx={}", batch, query, format_count(context));
  return fmt::format("decode b={} ctx={}", batch, format_count(context));
}

int64_t parse_count(std::string_view s, std::string_view what) {
  std::string t;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  M3_CHECK(!t.empty(), "bench: {} is empty", what);
  int64_t mult = 1;
  char last = char(std::toupper(static_cast<unsigned char>(t.back())));
  if (last == 'K') mult = int64_t(1) << 10;
  if (last == 'M') mult = int64_t(1) << 20;
  if (mult != 1) t.pop_back();
  M3_CHECK(!t.empty(), "bench: {} '{}' has no number", what, s);
  int64_t v = 0;
  for (char c : t) {
    M3_CHECK(std::isdigit(static_cast<unsigned char>(c)), "bench: {} '{}' is not a count (e.g. 100, 8K, 1M)", what, s);
    M3_CHECK(v <= (std::numeric_limits<int32_t>::max() - (c - '0')) / 10, "bench: {} '{}' is too large", what, s);
    v = v * 10 + (c - '0');
  }
  M3_CHECK(v <= std::numeric_limits<int32_t>::max() / mult, "bench: {} '{}' is too large", what, s);
  return v * mult;
}

std::vector<int64_t> parse_count_list(std::string_view s, std::string_view what) {
  std::vector<int64_t> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string_view::npos) e = s.size();
    out.push_back(parse_count(s.substr(b, e - b), what));
    b = e + 1;
  }
  return out;
}

std::string format_count(int64_t v) {
  if (v >= (1 << 20) && v % (1 << 20) == 0) return fmt::format("{}M", v >> 20);
  if (v >= (1 << 10) && v % (1 << 10) == 0) return fmt::format("{}K", v >> 10);
  return fmt::format("{}", v);
}

std::vector<BenchCase> make_cases(const std::vector<int64_t>& batches, const std::vector<int64_t>& contexts,
                                  const std::vector<int64_t>& prefills, const std::vector<int64_t>& queries) {
  std::vector<BenchCase> out;
  for (int64_t q : queries) M3_CHECK(q >= 1 && q <= 4, "bench: query length {} outside [1, 4]", q);
  for (int64_t c : contexts) {
    M3_CHECK(c >= 0, "bench: context {} < 0", c);
    for (int64_t q : queries)
      for (int64_t b : batches) {
        M3_CHECK(b >= 1 && b <= 1024, "bench: batch {} outside [1, 1024]", b);
        out.push_back(BenchCase{int(b), c, 0, int(q)});
      }
  }
  for (int64_t t : prefills) {
    M3_CHECK(t >= 1, "bench: prefill {} < 1", t);
    out.push_back(BenchCase{1, 0, t});
  }
  M3_CHECK(!out.empty(), "bench: no cases (give --batch and --context, or --prefill)");
  return out;
}

ModelSpec shard_spec(const ModelSpec& spec, int k) {
  M3_CHECK(k >= 1, "bench: --tp-shard must be >= 1, got {}", k);
  if (k == 1) return spec;
  ModelSpec s = tp_rank_spec(spec, k, "bench: --tp-shard");
  s.vocab_size /= k;  // one rank's lm_head rows (the bench's model is the rank's whole shard)
  if (s.bos_id >= s.vocab_size) s.bos_id = -1;
  if (s.eos_id >= s.vocab_size) s.eos_id = -1;
  s.validate("--tp-shard " + std::to_string(k));
  return s;
}

ModelSpec last_layers(const ModelSpec& spec, int n) {
  M3_CHECK(n >= 1 && n <= spec.num_layers, "bench: --layers {} outside [1, {}]", n, spec.num_layers);
  ModelSpec s = spec;
  s.num_layers = n;
  s.attn.assign(spec.attn.end() - n, spec.attn.end());
  s.mlp.assign(spec.mlp.end() - n, spec.mlp.end());
  s.validate("--layers " + std::to_string(n));
  return s;
}

}  // namespace m3::bench
