// Device codecs equal the host codecs on every code point (bitwise), outputs poisoned first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/codecs.h"
#include "native/cuda_check.h"
#include "native/dequant.h"

using namespace m3;

namespace {
std::vector<float> run(DType t, const std::vector<uint8_t>& bytes, size_t n) {
  void* din; float* dout;
  M3_CUDA_CHECK(cudaMalloc(&din, bytes.size()));
  M3_CUDA_CHECK(cudaMalloc(&dout, n * 4));
  M3_CUDA_CHECK(cudaMemcpy(din, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  M3_CUDA_CHECK(cudaMemset(dout, 0xff, n * 4));  // poison: NaN everywhere
  native::dequantize(t, din, dout, n, nullptr);
  std::vector<float> out(n);
  M3_CUDA_CHECK(cudaMemcpy(out.data(), dout, n * 4, cudaMemcpyDeviceToHost));
  cudaFree(din); cudaFree(dout);
  return out;
}
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }
}  // namespace

TEST(GpuDequant, AllCodesMatchHost) {
  std::vector<uint8_t> b8(256);
  for (int i = 0; i < 256; ++i) b8[size_t(i)] = uint8_t(i);
  auto e4 = run(DType::F8_E4M3, b8, 256);
  auto e8 = run(DType::E8M0, b8, 256);
  auto e2 = run(DType::E2M1x2, b8, 512);
  for (int i = 0; i < 256; ++i) {
    EXPECT_TRUE(same(e4[size_t(i)], e4m3_to_f32(uint8_t(i)))) << i;
    EXPECT_TRUE(same(e8[size_t(i)], e8m0_to_f32(uint8_t(i)))) << i;
    EXPECT_TRUE(same(e2[size_t(2 * i)], e2m1_to_f32(uint8_t(i & 15)))) << i;
    EXPECT_TRUE(same(e2[size_t(2 * i + 1)], e2m1_to_f32(uint8_t(i >> 4)))) << i;
  }
  std::vector<uint8_t> b16(65536 * 2);
  for (int i = 0; i < 65536; ++i) std::memcpy(&b16[size_t(2 * i)], &i, 2);
  auto bf = run(DType::BF16, b16, 65536);
  auto hf = run(DType::F16, b16, 65536);
  for (int i = 0; i < 65536; ++i) {
    ASSERT_TRUE(same(bf[size_t(i)], bf16_to_f32(uint16_t(i)))) << i;
    ASSERT_TRUE(same(hf[size_t(i)], f16_to_f32(uint16_t(i)))) << i;
  }
}
