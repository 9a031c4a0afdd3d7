// bench/cuda/eagle3_bench.h.
#include "bench/cuda/eagle3_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "model/eagle3_spec.h"
#include "model/eagle3_weights.h"
#include "native/eagle3_net.h"

namespace m3::bench {

namespace {

// uniform in [-a, a), a cheap counter hash (the values do not matter, only that they are finite)
void fill(std::vector<float>& v, uint64_t seed, float a) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    v[i] = a * (float(x >> 40) / float(1 << 23) - 1.0f);
  }
}

Mat mat(int rows, int cols, uint64_t seed) {
  Mat m(rows, cols);
  fill(m.data, seed, 1.0f / std::sqrt(float(cols)));
  return m;
}

// sums by name, in first-seen order
std::vector<std::pair<std::string, double>> merge(std::vector<std::pair<std::string, double>> a,
                                                  const std::vector<std::pair<std::string, double>>& b) {
  for (const auto& [name, us] : b) {
    auto it = std::find_if(a.begin(), a.end(), [&](const auto& e) { return e.first == name; });
    if (it == a.end()) a.emplace_back(name, us);
    else it->second += us;
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void bench_eagle3_draft(const ModelSpec& target, uint64_t seed, BenchReport& r) {
  // The shape: EAGLE3 drafts published for models of this size (one Llama layer of the target's
  // hidden size, 128-dim heads with 8 kv heads, a SiLU MLP of ~2.7x hidden, a 32K draft
  // vocabulary mapped by d2t, three aux layers); MiniMax-M3's own draft's config is not at hand.
  Eagle3Spec s;
  s.hidden = s.target_hidden = target.hidden;
  s.head_dim = 128;
  s.num_heads = target.hidden / 128;
  s.num_kv_heads = 8;
  s.intermediate = (target.hidden * 8 / 3 + 255) / 256 * 256;
  s.vocab = target.vocab_size;
  s.draft_vocab = std::min(32000, target.vocab_size);
  s.aux_layers = {0, 1, 2};
  const int H = s.hidden;
  std::fprintf(stderr, "bench: eagle3 draft, random weights of hidden %d, %d heads, intermediate %d, draft vocab %d\n",
               H, s.num_heads, s.intermediate, s.draft_vocab);
  Eagle3Weights w;
  w.fc = mat(H, s.fc_in(), seed + 1);
  w.input_norm.assign(size_t(H), 1.0f);
  w.hidden_norm.assign(size_t(H), 1.0f);
  w.post_norm.assign(size_t(H), 1.0f);
  w.norm.assign(size_t(H), 1.0f);
  w.wq = mat(s.q_dim(), 2 * H, seed + 2);
  w.wk = mat(s.kv_dim(), 2 * H, seed + 3);
  w.wv = mat(s.kv_dim(), 2 * H, seed + 4);
  w.wo = mat(H, s.q_dim(), seed + 5);
  w.gate = mat(s.intermediate, H, seed + 6);
  w.up = mat(s.intermediate, H, seed + 7);
  w.down = mat(H, s.intermediate, seed + 8);
  w.embed = mat(s.vocab, H, seed + 9);
  w.lm_head = mat(s.draft_vocab, H, seed + 10);
  w.d2t.assign(size_t(s.draft_vocab), 0);
  native::CudaEagle3Net net(s, std::move(w));
  std::vector<float> aux(size_t(s.fc_in()));
  fill(aux, seed + 11, 1.0f);
  // per stage, us a call (the net's events), in first-seen order
  auto stages = [&](const std::vector<std::pair<std::string, double>>& sums, int calls) {
    std::string out;
    for (const auto& [name, us] : sums) out += fmt::format("{}{} {:.1f}", out.empty() ? "" : ", ", name, us / calls);
    return out;
  };
  for (int context : {1024, 8192}) {
    // a history first (the draft attends over its own K/V)
    auto seq = net.new_sequence();
    std::vector<int32_t> hist(static_cast<size_t>(context));
    for (size_t i = 0; i < hist.size(); ++i) hist[i] = int32_t(i * 7919 % size_t(s.vocab));
    std::vector<float> hist_aux(hist.size() * aux.size());
    fill(hist_aux, seed + 12, 1.0f);
    net.observe(*seq, 0, hist, hist_aux.data());
    int32_t pos = int32_t(hist.size());
    std::vector<double> obs, chain;
    std::vector<std::pair<std::string, double>> obs_stages, chain_stages;
    int obs_calls = 0, chain_calls = 0;
    for (int rep = 0; rep < 80; ++rep) {
      const bool profiled = rep >= 60;  // events after every launch: timed apart from the wall times
      const int32_t tok = int32_t(rep * 31 % s.vocab);
      int32_t drafts[2];
      net.set_profile(profiled);
      auto t0 = std::chrono::steady_clock::now();
      const int32_t d0 = net.observe(*seq, pos, std::span<const int32_t>(&tok, 1), aux.data());
      auto t1 = std::chrono::steady_clock::now();
      if (profiled) {
        obs_stages = merge(obs_stages, net.profile());
        obs_calls += net.profiled_calls();
        net.set_profile(true);
      }
      net.draft_chain(*seq, pos + 1, d0, 2, drafts);
      auto t2 = std::chrono::steady_clock::now();
      if (profiled) {
        chain_stages = merge(chain_stages, net.profile());
        chain_calls += net.profiled_calls();
      }
      ++pos;
      if (rep < 10 || profiled) continue;  // warm-up
      obs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      chain.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    net.set_profile(false);
    const double o = median(obs), c = median(chain);
    r.notes.push_back(fmt::format(
        "eagle3 draft on the GPU (random weights: hidden {}, {} x 128 heads / 8 kv, intermediate {}, draft vocab {}; "
        "{:.0f} MB in BF16 with the embedding; after a {}-token history): observe of 1 row {:.1f} us, a chain of 2 "
        "draft rows {:.1f} us (medians of 50, wall time); 3 drafts a step cost {:.1f} us. Device time by stage, us a "
        "call: observe: {}; chain of 2: {}",
        H, s.num_heads, s.intermediate, s.draft_vocab, double(net.device_bytes()) / 1e6, context, o, c, o + c,
        stages(obs_stages, obs_calls), stages(chain_stages, chain_calls)));
    std::fprintf(stderr, "bench: %s\n", r.notes.back().c_str());
  }
}

}  // namespace m3::bench
