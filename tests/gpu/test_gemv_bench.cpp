// Timings of the weight-streaming kernels (run with M3_BENCH=1; skipped otherwise): FP8 GEMV at
// M = 1 and 4 on the real projection shapes, BF16 lm_head slice, the MXFP4 MoE layer at decode
// sizes, and the GEMM path at larger M, each against a plain streaming read of the same bytes.
// Cold: every launch reads a different copy of the weights, rotating over more than 4x the L2.
// CUDA events around a whole rotation, median of the repetitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>

#include "native/linear.h"
#include "native/moe.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

namespace {

bool bench_on() {
  const char* v = std::getenv("M3_BENCH");
  return v && *v && *v != '0';
}

struct Row {
  std::string name;
  double bytes, us, stream_us, flops;
};
std::vector<Row>& table() {
  static std::vector<Row> t;
  return t;
}

// Median over reps of (time of one rotation of n launches) / n.
double time_us(int n, const std::function<void(int)>& launch, int reps = 15) {
  cudaEvent_t a, b;
  M3_CUDA_CHECK(cudaEventCreate(&a));
  M3_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < n; ++i) launch(i);  // warm-up
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    M3_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < n; ++i) launch(i);
    M3_CUDA_CHECK(cudaEventRecord(b));
    M3_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(double(ms) * 1000.0 / n);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

namespace {

double stream_us(const std::vector<const uint8_t*>& bufs, size_t bytes) {
  DevBuf<uint32_t> sink(1056);
  return time_us(int(bufs.size()), [&](int i) {
    stream_read_device(bufs[size_t(i)], bytes, sink.p);
  });
}

int copies_for(size_t bytes) { return int(std::max<size_t>(4, (size_t(480) << 20) / bytes + 1)); }

void bench_fp8(int N, int K, const std::vector<int>& Ms, DType xt) {
  const int64_t ld = (K + 15) / 16 * 16;
  const size_t bytes = size_t(N) * ld;
  const int nb = copies_for(bytes);
  DevBuf<uint8_t> w(bytes * nb);
  fill_random_device(w.p, w.n, 7, FillKind::Fp8NoNan);
  DevBuf<float> sc(static_cast<size_t>(N));
  sc.upload(std::vector<float>(size_t(N), 1e-3f));
  std::vector<const uint8_t*> bufs;
  for (int i = 0; i < nb; ++i) bufs.push_back(w.p + size_t(i) * bytes);
  const double s_us = stream_us(bufs, bytes);
  for (int M : Ms) {
    std::mt19937 rng(M);
    auto x = random_acts(rng, M, K, ld);
    DevBuf<uint8_t> xd(x.size() * 4);
    if (xt == DType::BF16) {
      auto b = to_bf16(x);
      M3_CUDA_CHECK(cudaMemcpy(xd.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    } else {
      M3_CUDA_CHECK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    }
    DevBuf<float> y(size_t(M) * N);
    const double us = time_us(nb, [&](int i) {
      native::Fp8Weight v{bufs[size_t(i)], sc.p, N, K, ld};
      native::linear_fp8(v, native::ActIn{xd.p, xt, ld}, M, y.p, N, nullptr);
    });
    table().push_back({"fp8 " + std::to_string(N) + "x" + std::to_string(K) + " M=" + std::to_string(M) +
                           (xt == DType::BF16 ? " x bf16" : " x f32") + (M > native::kGemvMaxM ? " gemm" : " gemv"),
                       double(bytes), us, s_us, 2.0 * M * N * K});
  }
}

}  // namespace

TEST(GpuBench, WeightStreaming) {
  if (!bench_on()) GTEST_SKIP() << "set M3_BENCH=1";
  cudaDeviceProp prop{};
  M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  bench_fp8(9856, 6144, {1, 4}, DType::BF16);
  bench_fp8(9856, 6144, {1, 4, 8, 16}, DType::F32);
  bench_fp8(2560, 6144, {1, 4}, DType::BF16);
  bench_fp8(6144, 8192, {1, 4}, DType::BF16);
  bench_fp8(6144, 2048, {1, 4}, DType::BF16);
  bench_fp8(9856, 6144, {64, 512}, DType::BF16);

  {  // BF16 lm_head slice of one TP-4 rank: 50016 x 6144
    const int N = 50016, K = 6144;
    const size_t bytes = size_t(N) * K * 2;
    DevBuf<uint8_t> w(bytes);
    fill_random_device(w.p, w.n, 9, FillKind::Fp8NoNan);  // any finite bf16 bit patterns will do
    const double s_us = stream_us({w.p}, bytes);
    std::mt19937 rng(3);
    auto x = random_acts(rng, 1, K, K);
    DevBuf<float> xd(x.size()), y(static_cast<size_t>(N));
    xd.upload(x);
    const double us = time_us(1, [&](int) {
      native::linear_dense(native::DenseWeight{w.p, DType::BF16, N, K, K * 2}, native::ActIn{xd.p, DType::F32, K}, 1,
                           y.p, N, nullptr);
    });
    table().push_back({"bf16 lm_head 50016x6144 M=1", double(bytes), us, s_us, 2.0 * N * K});
  }

  {  // MXFP4 MoE layer, real TP-1 shapes, decode
    const int E = 128, K = 4, H = 6144, I = 3072, slots = E + 1;
    const int64_t ld13 = H / 2, sld13 = H / 32, ld2 = I / 2, sld2 = I / 32;
    DevBuf<uint8_t> c13(size_t(slots) * 2 * I * ld13), s13(size_t(slots) * 2 * I * sld13), c2(size_t(slots) * H * ld2),
        s2(size_t(slots) * H * sld2);
    fill_random_device(c13.p, c13.n, 1, FillKind::Bytes);
    fill_random_device(s13.p, s13.n, 2, FillKind::E8M0Range, 119, 121);
    fill_random_device(c2.p, c2.n, 3, FillKind::Bytes);
    fill_random_device(s2.p, s2.n, 4, FillKind::E8M0Range, 119, 121);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    std::vector<float> router(size_t(E) * H), bias(static_cast<size_t>(E));
    for (auto& v : router) v = nd(rng) * 0.02f;
    for (auto& v : bias) v = nd(rng) * 0.05f;
    DevBuf<float> rd(router.size()), bd(bias.size());
    rd.upload(router);
    bd.upload(bias);
    native::MoeWeights w;
    w.router = native::DenseWeight{rd.p, DType::F32, E, H, H * 4};
    w.router_bias = bd.p;
    auto ex = [&](DevBuf<uint8_t>& c, DevBuf<uint8_t>& s, int rows, int cols, int64_t ld, int64_t sld) {
      native::Mxfp4Experts e;
      e.codes = c.p;
      e.scales = s.p;
      e.ld = ld;
      e.sld = sld;
      e.slot_codes = rows * ld;
      e.slot_scales = rows * sld;
      e.slots = slots;
      e.rows = rows;
      e.cols = cols;
      return e;
    };
    w.w13 = ex(c13, s13, 2 * I, H, ld13, sld13);
    w.w2 = ex(c2, s2, H, I, ld2, sld2);
    w.shared_in_slot = true;
    w.E = E;
    w.K = K;
    const double slot_bytes = double(2 * I) * (ld13 + sld13) + double(H) * (ld2 + sld2);
    for (int M : {1, 4}) {
      const int nx = 8;  // different tokens route to different experts: mostly cold reads
      auto x = random_acts(rng, M * nx, H, H);
      DevBuf<float> xd(x.size()), out(size_t(M) * H);
      xd.upload(x);
      const size_t wsb = native::moe_workspace_bytes(w, M);
      DevBuf<uint8_t> ws(wsb);
      // bytes actually read: distinct experts hit per call (+ shared, + router)
      double bytes = 0;
      for (int i = 0; i < nx; ++i) {
        native::moe_forward(w, xd.p + size_t(i) * M * H, H, M, out.p, H, ws.p, wsb, nullptr);
        std::vector<int32_t> ids(size_t(M) * K);
        M3_CUDA_CHECK(cudaMemcpy(ids.data(), native::moe_workspace(w, M, ws.p).ids, ids.size() * 4,
                                 cudaMemcpyDeviceToHost));
        std::sort(ids.begin(), ids.end());
        bytes += double(std::unique(ids.begin(), ids.end()) - ids.begin() + 1) * slot_bytes + double(E) * H * 4;
      }
      bytes /= nx;
      const double us = time_us(nx, [&](int i) {
        native::moe_forward(w, xd.p + size_t(i) * M * H, H, M, out.p, H, ws.p, wsb, nullptr);
      });
      std::vector<const uint8_t*> bufs;  // as many distinct copies of the bytes as c13 holds
      for (size_t i = 0; i < 8 && (i + 1) * size_t(bytes) <= c13.n; ++i) bufs.push_back(c13.p + i * size_t(bytes));
      const double s_us = stream_us(bufs, size_t(bytes) / 16 * 16);
      table().push_back({"moe mxfp4 real tp1 M=" + std::to_string(M), bytes, us, s_us, 0});
      // host cost of enqueueing one layer (checks + 7-9 launches)
      const auto h0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) native::moe_forward(w, xd.p, H, M, out.p, H, ws.p, wsb, nullptr);
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / 20;
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      std::printf("  moe M=%d: host enqueue %.1f us per layer\n", M, host_us);
      if (M == 1) {  // the router GEMV alone (fp32 [128, 6144])
        DevBuf<float> lg(static_cast<size_t>(E));
        const double r_us = time_us(1, [&](int) {
          native::linear_dense(w.router, native::ActIn{xd.p, DType::F32, H}, 1, lg.p, E, nullptr);
        });
        table().push_back({"router f32 128x6144 M=1 gemv", double(E) * H * 4, r_us, 0, 2.0 * E * H});
      }
    }
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::printf("\n%s, %d SMs, L2 %d MB, %s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, date);
  std::printf("%-44s %10s %10s %9s %10s %9s %8s\n", "kernel", "MB", "us", "GB/s", "stream us", "stream%", "TFLOP/s");
  for (const Row& r : table())
    std::printf("%-44s %10.1f %10.2f %9.0f %10.2f %8.0f%% %8.1f\n", r.name.c_str(), r.bytes / 1e6, r.us,
                r.bytes / r.us / 1e3, r.stream_us, 100.0 * r.stream_us / r.us, r.flops / r.us / 1e6);
}
