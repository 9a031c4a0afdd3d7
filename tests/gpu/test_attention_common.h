// Helpers shared by the cache / rope / indexer / attention GPU tests: device buffers, seeded
// generators, random paged scenarios (requests with shuffled block tables) and host-side cache
// filling with the project's codecs, so the reference reads exactly the numbers the GPU reads.
// NOTE: in their own namespace: other GPU test helpers define m3::test::DevBuf differently, and
// all GPU tests link into one binary (one definition per name).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "core/codecs.h"
#include "core/dtype.h"
#include "native/cuda_check.h"
#include "native/kv_cache.h"
#include "native/step_metadata.h"

namespace m3::test::cache_tests {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) { M3_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(std::exchange(o.p, nullptr)), n(o.n) {}
  void upload(const std::vector<T>& h) {
    M3_CHECK(h.size() == n, "DevBuf upload: {} elements into {}", h.size(), n);
    M3_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    M3_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison(uint8_t byte = 0xff) { M3_CUDA_CHECK(cudaMemset(p, byte, std::max<size_t>(n, 1) * sizeof(T))); }
};

// One generator per test, seeded from std::random_device; the seed goes into every failure message.
struct Rng {
  uint32_t seed;
  std::mt19937 gen;
  // fresh each run; M3_TEST_SEED (the value a failing run printed) replays one
  Rng() : seed(initial_seed()), gen(seed) {}
  static uint32_t initial_seed() {
    if (const char* s = std::getenv("M3_TEST_SEED")) return uint32_t(std::strtoul(s, nullptr, 10));
    return std::random_device{}();
  }
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.f, sd)(gen); }
  float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(gen); }
  int uniform_int(int a, int b) { return std::uniform_int_distribution<int>(a, b)(gen); }
  std::vector<float> normals(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(sd);
    return v;
  }
};

// Requests (start_pos, num_new) with block tables drawn from a random permutation of the pool.
struct Scenario {
  int block_size = 0, num_blocks = 0;
  std::vector<std::pair<int, int>> seqs;    // (start_pos, num_new)
  std::vector<std::vector<int32_t>> tables;
  native::StepMetadata meta;
};

inline Scenario make_scenario(const std::vector<std::pair<int, int>>& seqs, int block_size, int pad_to,
                              std::mt19937& gen, int spare_blocks = 3) {
  Scenario s;
  s.block_size = block_size;
  s.seqs = seqs;
  int need = 0;
  for (auto [start, n] : seqs) need += (start + n + block_size - 1) / block_size;
  s.num_blocks = need + spare_blocks;
  std::vector<int32_t> perm(size_t(s.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  size_t next = 0;
  for (auto [start, n] : seqs) {
    int nb = (start + n + block_size - 1) / block_size;
    s.tables.emplace_back(perm.begin() + ptrdiff_t(next), perm.begin() + ptrdiff_t(next + size_t(nb)));
    next += size_t(nb);
  }
  std::vector<native::SeqRows> rows(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    rows[i].start_pos = seqs[i].first;
    rows[i].num_new = seqs[i].second;
    rows[i].block_table = s.tables[i];
  }
  s.meta = native::build_step_metadata(rows, block_size, s.num_blocks, pad_to);
  return s;
}

// The scenario of a test case's requests (seqs: (start_pos, num_new)) padded with `pad` rows.
inline Scenario make_padded_scenario(const std::vector<std::pair<int, int>>& seqs, int block_size, int pad,
                                     std::mt19937& gen) {
  int live = 0;
  for (auto [start, n] : seqs) live += n;
  return make_scenario(seqs, block_size, live + pad, gen);
}

// Stored element codecs of the caches.
inline size_t elem_bytes(DType t) { return t == DType::BF16 ? 2 : 1; }
inline void encode_elem(DType t, float x, uint8_t* dst) {
  if (t == DType::BF16) {
    uint16_t h = f32_to_bf16(x);
    std::memcpy(dst, &h, 2);
  } else {
    *dst = f32_to_e4m3(x);
  }
}
inline float decode_elem(DType t, const uint8_t* src) {
  if (t == DType::BF16) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    return bf16_to_f32(h);
  }
  return e4m3_to_f32(*src);
}

// Writes `rows` vectors of `width` floats (x / scale, encoded) at element offset slot * width of a
// host cache image, and returns what a reader decodes (stored * scale).
inline std::vector<float> store_rows(DType t, float scale, const std::vector<float>& x, int width,
                                     const std::vector<int64_t>& slots, std::vector<uint8_t>& image) {
  std::vector<float> deq(x.size());
  size_t eb = elem_bytes(t);
  for (size_t r = 0; r < slots.size(); ++r)
    for (int d = 0; d < width; ++d) {
      size_t i = r * size_t(width) + size_t(d);
      uint8_t* dst = image.data() + (size_t(slots[r]) * size_t(width) + size_t(d)) * eb;
      encode_elem(t, x[i] / scale, dst);
      deq[i] = decode_elem(t, dst) * scale;
    }
  return deq;
}

// Slots of every position of request i (0 .. start + n - 1), in position order.
inline std::vector<int64_t> request_slots(const Scenario& s, size_t i) {
  int len = s.seqs[i].first + s.seqs[i].second;
  std::vector<int64_t> out(static_cast<size_t>(len));
  for (int p = 0; p < len; ++p)
    out[size_t(p)] = int64_t(s.tables[i][size_t(p / s.block_size)]) * s.block_size + p % s.block_size;
  return out;
}

// Power-of-two-free scale so FP8 rounding is exercised with a non-trivial multiplier.
inline float fp8_scale_for(float amax, Rng& rng) { return amax / 448.0f * rng.uniform(0.8f, 1.2f); }

}  // namespace m3::test::cache_tests
