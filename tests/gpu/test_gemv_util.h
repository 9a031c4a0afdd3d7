// Helpers of the weight-kernel GPU tests (gemv, moe, router, norm, embed, prepared): device
// buffers, bf16-exact random activations, device-side random fills for large weight tensors,
// and the comparison of a GPU result against the CPU reference with the worst element printed.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/compare.h"
#include "core/parallel.h"
#include "core/codecs.h"
#include "native/cuda_check.h"
#include "test_moe_fill.h"

namespace m3::test {

inline constexpr double kU = 0x1p-24;  // fp32 unit roundoff

// One thread pool (all cores) for the CPU references of the GPU tests.
inline ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) { M3_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T) + 16)); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (p) cudaFree(p);
      p = o.p;
      n = o.n;
      o.p = nullptr;
    }
    return *this;
  }
  void upload(const std::vector<T>& h) {
    M3_CHECK(h.size() <= n, "upload of {} > {}", h.size(), n);
    M3_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    M3_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { M3_CUDA_CHECK(cudaMemset(p, 0xff, n * sizeof(T))); }  // fp32 0xffffffff is NaN
};

inline uint32_t gpu_test_seed() {
  static const uint32_t s = std::random_device{}();
  return s;
}

inline float bf16_round(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Activations that bf16 represents exactly (so the bf16 and fp32 inputs, and the GEMM path's
// conversion to bf16, all carry the same numbers): normal with a per-row scale.
inline std::vector<float> random_acts(std::mt19937& rng, int M, int K, int64_t ld) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  std::vector<float> x(size_t(M) * size_t(ld), 0.f);
  for (int t = 0; t < M; ++t) {
    float s = sc(rng);
    for (int k = 0; k < K; ++k) x[size_t(t) * ld + k] = bf16_round(nd(rng) * s);
  }
  return x;
}
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  return b;
}

// got vs ref (row-major [M][N], ref stride N, got stride ld_got), every element checked.
inline void expect_close_rows(const std::vector<float>& got, int64_t ld_got, const std::vector<float>& ref, int M, int N,
                              double atol, double rtol, const std::string& what) {
  std::vector<float> g(size_t(M) * size_t(N));
  for (int t = 0; t < M; ++t)
    std::memcpy(g.data() + size_t(t) * N, got.data() + size_t(t) * ld_got, size_t(N) * 4);
  auto r = compare(g, ref, atol, rtol);
  EXPECT_TRUE(r.ok) << what << ": " << r.describe() << " (row " << r.worst_index / size_t(N) << ", col "
                    << r.worst_index % size_t(N) << ", atol " << atol << ")";
  std::printf("  %-48s worst |d| %.3g (atol %.3g) cos %.9f\n", what.c_str(), r.max_abs_err, atol, r.cosine);
}

}  // namespace m3::test
