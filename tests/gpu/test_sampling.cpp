// Sampling on the device (native/sampling.h, kernels/sampling.cuh) against the CPU sampler
// (runtime/sampler.h) on fresh random logits at vocab 1000 and 200064: greedy must be the same
// token always; stochastic the same token except where the draw u (or top_p) lies within double
// rounding of a cumulative boundary (the kernel sums in a different order: counted and printed
// separately, never seen with random draws). Ties, -0.0/+0.0, -inf/+inf entries, all -inf rows
// and NaN rows (flagged, naming the token) are planted. Outputs poisoned before every launch.
// Then CudaBackend with device sampling vs host sampling on a tiny synthetic model: the same
// tokens over 32 decode steps (greedy and seeded), prefill in several passes, logits copy skipped;
// and the scheduler over CudaBackend with device_sampling off and on: the same tokens. The timing
// test prints what the logits copy and the sampler cost at vocab 200064.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "native/kv_cache.h"
#include "native/sampling.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/step_sampling.h"
#include "test_cuda_backend_util.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

// Every parameter combination the sampler has: greedy, temperature alone, top-k (1, small, beyond
// the vocabulary), top-p, both, extreme temperatures.
std::vector<SamplingParams> param_grid(int V) {
  std::vector<SamplingParams> g;
  for (float T : {0.0f, 1.0f, 0.7f, 2.5f, 1e-4f})
    for (int k : {0, 1, 40, V + 7})
      for (float p : {1.0f, 0.9f, 0.3f}) {
        if (T == 0 && (k != 0 || p != 1)) continue;  // greedy ignores the filters
        g.push_back(SamplingParams{T, k, p, 0});
      }
  return g;
}

struct Case {
  int V, R;
  int64_t ld;
};

// true when u or top_p lies within `eps` of a cumulative boundary of the CPU's distribution
bool near_boundary(const float* row, int V, const SamplingParams& p, double u, double eps) {
  auto d = sampling_distribution(row, V, p);
  double c = 0;
  for (auto& e : d) {
    c += e.second;
    if (std::fabs(c - u) < eps) return true;
  }
  if (p.top_p < 1) {
    SamplingParams q = p;
    q.top_p = 1;
    auto f = sampling_distribution(row, V, q);
    c = 0;
    for (auto& e : f) {
      c += e.second;
      if (std::fabs(c - double(p.top_p)) < eps) return true;
    }
  }
  return false;
}

}  // namespace

TEST(GpuSampling, KernelMatchesCpuSampler) {
  const uint32_t seed = gpu_test_seed() + 31;
  std::printf("GpuSampling seed %u\n", seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::mt19937_64 rng64(seed);
  std::normal_distribution<float> nd;
  int checked = 0, boundary = 0, greedy_rows = 0, errors = 0;
  for (const Case& c : {Case{1000, 1, 1000}, Case{1000, 64, 1003}, Case{1000, 37, 1000}, Case{200064, 1, 200064},
                        Case{200064, 13, 200067}, Case{200064, 64, 200064}}) {
    SCOPED_TRACE("V " + std::to_string(c.V) + " R " + std::to_string(c.R));
    const int V = c.V, R = c.R;
    // logits rows: 2 extra rows so jobs may address any of R + 2 rows in any order
    const int rows = R + 2;
    std::vector<float> L(size_t(rows) * size_t(c.ld), NAN);  // padding past V stays NaN: never read
    for (int r = 0; r < rows; ++r) {
      float* x = &L[size_t(r) * size_t(c.ld)];
      const float scale = 0.5f + float(rng() % 8);
      for (int i = 0; i < V; ++i) x[i] = nd(rng) * scale;
      const int kind = int(rng() % 8);
      if (kind == 1) {  // heavy ties: a few distinct values
        for (int i = 0; i < V; ++i) x[i] = float(int(rng() % 4));
      } else if (kind == 2) {  // -inf entries, and +/-0.0
        for (int i = 0; i < V; ++i)
          if (rng() % 3 == 0) x[i] = -INFINITY;
        x[rng() % uint32_t(V)] = -0.0f;
        x[rng() % uint32_t(V)] = 0.0f;
      } else if (kind == 3) {  // +inf entries (two: a tie at +inf)
        x[rng() % uint32_t(V)] = INFINITY;
        x[rng() % uint32_t(V)] = INFINITY;
      } else if (kind == 4) {  // a planted tie at the top
        const float top = *std::max_element(x, x + V) + 1.0f;
        x[rng() % uint32_t(V)] = top;
        x[rng() % uint32_t(V)] = top;
      }
    }
    // one all -inf row and one NaN row (when there is room)
    if (rows > 3) {
      std::fill_n(&L[size_t(rows - 1) * size_t(c.ld)], V, -INFINITY);
      L[size_t(rows - 2) * size_t(c.ld) + size_t(rng() % uint32_t(V))] = NAN;
    }
    auto grid = param_grid(V);
    std::vector<kernels::SampleJob> jobs(static_cast<size_t>(R));
    std::vector<SamplingParams> ps(static_cast<size_t>(R));
    const size_t g0 = rng() % grid.size();
    for (int j = 0; j < R; ++j) {
      SamplingParams p = grid[(g0 + size_t(j)) % grid.size()];
      p.seed = rng64();
      ps[size_t(j)] = p;
      auto& q = jobs[size_t(j)];
      q.row = int64_t(rng() % uint32_t(rows));
      if (j < 2 && rows > 3) q.row = rows - 1 - j;  // the all -inf and the NaN row get jobs
      q.temperature = p.temperature;
      q.top_k = p.top_k;
      q.top_p = p.top_p;
      q.seed = p.seed;
      q.draw = rng64() % 100000;
    }
    DevBuf<float> dl(L.size());
    dl.upload(L);
    DevBuf<int32_t> tok(static_cast<size_t>(R)), st(static_cast<size_t>(R));
    native::DeviceSampler sampler(int(1 + rng() % 16), V);  // groups of 1..16 stochastic rows
    std::vector<int32_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      M3_CUDA_CHECK(cudaMemset(tok.p, 0x5a, tok.n * 4));
      M3_CUDA_CHECK(cudaMemset(st.p, 0x5a, st.n * 4));
      sampler.sample(dl.p, c.ld, jobs, tok.p, st.p, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      auto t = tok.download(), s = st.download();
      if (rep == 1) {
        EXPECT_EQ(t, first) << "a second launch gave different tokens";
        break;
      }
      first = t;
      for (int j = 0; j < R; ++j) {
        const auto& q = jobs[size_t(j)];
        const float* row = &L[size_t(q.row) * size_t(c.ld)];
        SamplerState ss{q.seed, q.draw};
        int want = -1;
        std::string err;
        try {
          want = sample_token(row, V, ps[size_t(j)], ss);
        } catch (const std::exception& e) {
          err = e.what();
        }
        SCOPED_TRACE("job " + std::to_string(j) + " row " + std::to_string(q.row) + " T " +
                     std::to_string(q.temperature) + " top_k " + std::to_string(q.top_k) + " top_p " +
                     std::to_string(q.top_p));
        if (!err.empty()) {
          ++errors;
          ASSERT_EQ(t[size_t(j)], -1);
          if (err.find("NaN") != std::string::npos) {
            int nan_id = 0;
            while (!std::isnan(row[nan_id])) ++nan_id;
            EXPECT_EQ(s[size_t(j)], 1 + nan_id) << err;
          } else {
            EXPECT_EQ(s[size_t(j)], kernels::kSampleAllNegInf) << err;
          }
          continue;
        }
        ASSERT_EQ(s[size_t(j)], kernels::kSampleOk) << "status " << s[size_t(j)];
        ++checked;
        if (q.temperature == 0) {
          ++greedy_rows;
          ASSERT_EQ(t[size_t(j)], want) << "greedy must be the CPU's argmax";
          continue;
        }
        if (t[size_t(j)] != want) {
          const double u = uniform_draw(q.seed, q.draw);
          // summation order: relative rounding below 1e-16 * V per sum; 1e-9 is far above it and
          // still a probability of ~1e-9 per row for a random u
          ASSERT_TRUE(near_boundary(row, V, ps[size_t(j)], u, 1e-9))
              << "device token " << t[size_t(j)] << ", CPU token " << want << ", u " << u << " not near a boundary";
          ++boundary;
        }
      }
    }
  }
  std::printf("GpuSampling: %d rows checked (%d greedy), %d error rows flagged, %d boundary differences\n", checked,
              greedy_rows, errors, boundary);
  RecordProperty("boundary_differences", boundary);
  EXPECT_GT(errors, 0);
}

TEST(GpuSampling, BadJobsThrowNamingTheField) {
  native::DeviceSampler sampler(2, 100);
  DevBuf<float> dl(100);
  DevBuf<int32_t> tok(1), st(1);
  kernels::SampleJob j;
  j.top_p = 0;
  try {
    sampler.sample(dl.p, 100, std::vector<kernels::SampleJob>{j}, tok.p, st.p, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
  std::vector<int32_t> status = {0, 3};
  try {
    native::check_sample_status(status, {"seqs[0]", "seqs[1]"});
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("seqs[1]: logit of token 2 is NaN"), std::string::npos) << e.what();
  }
}

TEST(GpuSampling, BackendDeviceSamplingEqualsHostSampling) {
  const uint64_t seed = model_test_seed();
  std::printf("GpuSampling backend seed %llu\n", (unsigned long long)seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int blocks = 32, V = spec.vocab_size;
  native::CudaBackendOptions o;
  o.num_cache_blocks = blocks;
  o.max_tokens = 24;  // prompts run in several passes
  o.max_graph_batch = 8;
  auto host_be = native::make_cuda_backend(m.pw, o);
  auto dev_be = native::make_cuda_backend(m.pw, o);
  for (auto* g : {host_be.get(), dev_be.get()}) g->kv_cache().fill(0x7f, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());

  const int S = 4;
  std::vector<SamplingParams> ps = {{0.0f, 0, 1.0f, rng()}, {1.0f, 0, 1.0f, rng()}, {0.8f, 40, 0.9f, rng()},
                                    {1.3f, 0, 0.5f, rng()}};
  std::vector<SamplerState> hs(S), ds(S);
  std::vector<std::vector<int32_t>> tables(S), toks_h(S), toks_d(S);
  for (int k = 0; k < S; ++k) {
    hs[size_t(k)] = ds[size_t(k)] = SamplerState{ps[size_t(k)].seed, 0};
    for (int b = 0; b < 8; ++b) tables[size_t(k)].push_back(k * 8 + b);
  }
  std::vector<std::vector<int32_t>> prompts(S);
  for (int k = 0; k < S; ++k)
    for (int i = 0; i < 10 + 13 * k; ++i) prompts[size_t(k)].push_back(int32_t(rng() % uint64_t(V)));
  std::vector<int32_t> pos(S, 0);
  int mismatches = 0;
  for (int step = 0; step <= 32; ++step) {
    StepBatch hb, db;
    for (int k = 0; k < S; ++k) {
      std::vector<int32_t> in = step == 0 ? prompts[size_t(k)] : std::vector<int32_t>{toks_h[size_t(k)].back()};
      hb.seqs.push_back(SeqStep{pos[size_t(k)], in, tables[size_t(k)], false});
      SeqStep q{pos[size_t(k)], step == 0 ? in : std::vector<int32_t>{toks_d[size_t(k)].back()}, tables[size_t(k)],
                false};
      q.sample = SamplingRequest{ps[size_t(k)], ds[size_t(k)]};
      q.want_logits = step % 8 == 5;  // now and then the logits too (they must equal the host run's)
      db.seqs.push_back(std::move(q));
    }
    StepOutput ho = host_be->step(hb);
    StepOutput dout = dev_be->step(db);
    ASSERT_EQ(dout.tokens.size(), size_t(S));
    if (step % 8 == 5) {
      ASSERT_EQ(dout.logits.size(), ho.logits.size());
      EXPECT_EQ(0, std::memcmp(dout.logits.data(), ho.logits.data(), ho.logits.size() * 4))
          << "step " << step << ": the two backends' logits differ (not deterministic?)";
    } else {
      EXPECT_TRUE(dout.logits.empty()) << "step " << step << ": logits copied although nobody asked";
    }
    for (int k = 0; k < S; ++k) {
      const int h = sample_token(ho.row(k), V, ps[size_t(k)], hs[size_t(k)]);
      const int d = dout.tokens[size_t(k)];
      if (ps[size_t(k)].temperature != 0) ds[size_t(k)].draws++;
      EXPECT_EQ(d, h) << "step " << step << " seq " << k << " T " << ps[size_t(k)].temperature;
      mismatches += d != h;
      toks_h[size_t(k)].push_back(int32_t(h));
      toks_d[size_t(k)].push_back(int32_t(d));
      pos[size_t(k)] += int(hb.seqs[size_t(k)].tokens.size());
    }
    if (mismatches) break;
  }
  auto st = dev_be->stats();
  std::printf("GpuSampling backend: %d sequences x 33 tokens, graph replays %lld, mismatches %d\n", S,
              (long long)st.graph_replays, mismatches);
  EXPECT_GT(st.graph_replays, 0);
}

// Not a check: what device sampling costs and what it saves at the real vocabulary, printed for
// docs/perf.md. Per decode step of R rows: the host path copies R x 200064 fp32 logits to pageable
// host memory (as CudaBackend does) and samples there; the device path runs the sampler and copies
// R tokens back.
TEST(GpuSampling, TimingAtRealVocab) {
  const int V = 200064;
  std::mt19937 rng(gpu_test_seed() + 77);
  std::normal_distribution<float> nd;
  std::vector<float> L(size_t(64) * V);
  for (auto& x : L) x = nd(rng) * 3.f;
  DevBuf<float> dl(L.size());
  dl.upload(L);
  DevBuf<int32_t> tok(64), st(64);
  native::DeviceSampler sampler(32, V);
  cudaStream_t s = nullptr;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  M3_CUDA_CHECK(cudaEventCreate(&e0));
  M3_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& f) {
    f();  // warm
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    const int reps = 5;
    M3_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) f();
    M3_CUDA_CHECK(cudaEventRecord(e1, s));
    M3_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / reps;
  };
  std::printf("GpuSampling timing (V %d): rows | D2H logits copy ms | host sample ms (1 thread) | device greedy ms | "
              "device T=1 ms | device T=1 top_k 50 ms\n", V);
  for (int R : {1, 8, 64}) {
    std::vector<float> host(size_t(R) * V);
    const double copy = time_ms([&] {
      M3_CUDA_CHECK(cudaMemcpyAsync(host.data(), dl.p, host.size() * 4, cudaMemcpyDeviceToHost, s));
    });
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r) {
      SamplerState ss{1, uint64_t(r)};
      (void)sample_token(&host[size_t(r) * V], V, SamplingParams{1.0f, 0, 1.0f, 1}, ss);
    }
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto jobs_of = [&](float T, int k) {
      std::vector<kernels::SampleJob> jobs(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        jobs[size_t(r)].row = r;
        jobs[size_t(r)].temperature = T;
        jobs[size_t(r)].top_k = k;
        jobs[size_t(r)].seed = 5;
        jobs[size_t(r)].draw = uint64_t(r);
      }
      return jobs;
    };
    auto g = jobs_of(0.f, 0), t1 = jobs_of(1.f, 0), tk = jobs_of(1.f, 50);
    const double dg = time_ms([&] { sampler.sample(dl.p, V, g, tok.p, st.p, s); });
    const double dt = time_ms([&] { sampler.sample(dl.p, V, t1, tok.p, st.p, s); });
    const double dk = time_ms([&] { sampler.sample(dl.p, V, tk, tok.p, st.p, s); });
    std::printf("GpuSampling timing: %3d | %.3f | %.3f | %.3f | %.3f | %.3f\n", R, copy, host_ms, dg, dt, dk);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
}

// The scheduler (what the engine runs) over CudaBackend, device_sampling off vs on: the same
// tokens for concurrent greedy and seeded requests with chunked prefill mixed into decode steps.
// The scheduler is driven directly (single-threaded), so both runs see the same batches.
TEST(GpuSampling, SchedulerSameTokensWithDeviceSampling) {
  const uint64_t seed = model_test_seed() + 5;
  std::printf("GpuSampling scheduler seed %llu\n", (unsigned long long)seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = seed;
  PreparedModel m = prepare_from_memory(spec, synthetic_weights(spec, so));
  const int V = spec.vocab_size;
  std::vector<GenerationRequest> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto& r = reqs[i];
    for (int k = 0, n = 5 + int(rng() % 50); k < n; ++k) r.prompt.push_back(int32_t(rng() % uint64_t(V)));
    r.max_tokens = 8 + int(rng() % 8);
    r.ignore_eos = true;
    if (i % 2 == 1) r.sampling = SamplingParams{0.9f, i == 3 ? 30 : 0, i == 5 ? 0.8f : 1.0f, rng()};
  }
  auto run = [&](bool device) {
    native::CudaBackendOptions o;
    o.num_cache_blocks = 48;
    o.max_graph_batch = 8;
    std::unique_ptr<Backend> d(native::make_cuda_backend(m.pw, o));
    SchedulerOptions so2{4, 32, 0};
    so2.device_sampling = device;
    Scheduler s(*d, so2);
    std::vector<std::vector<int32_t>> out(reqs.size());
    std::vector<std::string> errs(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i)
      s.add(i, reqs[i], [&out, &errs, i](const RequestEvent& e) {
        out[i].insert(out[i].end(), e.new_tokens.begin(), e.new_tokens.end());
        if (e.finished && e.reason != FinishReason::Length) errs[i] = e.error.empty() ? "not Length" : e.error;
      });
    int steps = 0;
    while (s.has_work() && steps < 1000) s.step(), ++steps;
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(errs[i], "") << "request " << i;
    return out;
  };
  auto host = run(false), dev = run(true);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(int(host[i].size()), reqs[i].max_tokens);
    EXPECT_EQ(dev[i], host[i]) << "request " << i << " T " << reqs[i].sampling.temperature;
  }
}
