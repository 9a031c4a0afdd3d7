// Embedding gather on the GPU (native/embed.h): rows equal the BF16 table rows exactly (fp32 and
// bf16 outputs), ids out of range give NaN rows, outputs poisoned first.
#include <gtest/gtest.h>

#include <random>

#include "native/embed.h"
#include "test_gemv_util.h"

using namespace m3;
using namespace m3::test;

TEST(GpuEmbed, GatherRowsAndRejectBadIds) {
  const uint32_t seed = gpu_test_seed() + 31;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int V = 1000, H = 6144, M = 9;
  const int64_t ld = H + 8;
  std::vector<uint16_t> table(size_t(V) * ld);
  for (auto& v : table) v = uint16_t(rng() & 0xffff);
  for (auto& v : table)
    if ((v & 0x7f80) == 0x7f80) v &= 0xbfff;  // no inf/NaN in the table: NaN rows must mean a bad id
  std::vector<int32_t> ids = {0, V - 1, 17, -1, V, 500, 500, int32_t(rng() % V), 3};
  DevBuf<uint16_t> dt(table.size()), dob(size_t(M) * H);
  DevBuf<int32_t> di(ids.size());
  DevBuf<float> dout(size_t(M) * H);
  M3_CUDA_CHECK(cudaMemcpy(dt.p, table.data(), table.size() * 2, cudaMemcpyHostToDevice));
  di.upload(ids);
  dout.poison();
  M3_CUDA_CHECK(cudaMemset(dob.p, 0x55, dob.n * 2));
  kernels::EmbedParams a;
  a.table = dt.p;
  a.ld = ld;
  a.V = V;
  a.H = H;
  a.M = M;
  a.ids = di.p;
  a.out = dout.p;
  a.ld_out = H;
  a.out_bf16 = dob.p;
  a.ld_ob = H;
  native::embed(a, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
  auto out = dout.download();
  std::vector<uint16_t> ob(dob.n);
  M3_CUDA_CHECK(cudaMemcpy(ob.data(), dob.p, ob.size() * 2, cudaMemcpyDeviceToHost));
  for (int t = 0; t < M; ++t) {
    const bool ok = ids[size_t(t)] >= 0 && ids[size_t(t)] < V;
    for (int h = 0; h < H; ++h) {
      const float v = out[size_t(t) * H + h];
      if (!ok) {
        ASSERT_TRUE(std::isnan(v)) << "token " << t << " (id " << ids[size_t(t)] << ") col " << h;
        continue;
      }
      const uint16_t want = table[size_t(ids[size_t(t)]) * ld + h];
      ASSERT_EQ(ob[size_t(t) * H + h], want) << "token " << t << " col " << h;
      ASSERT_EQ(std::memcmp(&v, std::vector<float>{bf16_to_f32(want)}.data(), 4), 0) << "token " << t << " col " << h;
    }
  }
}
