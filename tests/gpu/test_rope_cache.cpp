// Fused q/k norm + partial RoPE + cache insert (native/qk_norm_rope.h) against the CPU reference
// ops (ref::gemma_rms_norm, ref::Rope): q and iq rows elementwise; K, V and index-K cache entries
// decoded and compared within one storage rounding step (and nearly all bit-exact); every slot not
// written by a live row (padding rows have slot -1) still holds the poison bytes.
#include <algorithm>
#include <set>

#include "common/compare.h"
#include "native/qk_norm_rope.h"
#include "ref/norm.h"
#include "ref/rope.h"
#include "test_attention_common.h"

using namespace m3;
using namespace m3::test;
using namespace m3::test::cache_tests;

namespace {

struct RopeCase {
  const char* name;
  int H, KV, D, IH, ID, rot, bs;
  DType kv, ik;
  std::vector<std::pair<int, int>> seqs;
  int pad;
  double theta = 5e6;
};

void run_case(const RopeCase& c) {
  Rng rng;
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << rng.seed);
  int live = 0;
  for (auto [s, n] : c.seqs) live += n;
  Scenario sc = make_scenario(c.seqs, c.bs, live + c.pad, rng.gen);
  const auto& meta = sc.meta;
  const int T = meta.num_tokens;
  const bool sparse = c.IH > 0;
  const int width = (c.H + 2 * c.KV) * c.D + (sparse ? (c.IH + 1) * c.ID : 0);
  const int stride = width + 3;  // rows not 16-byte aligned on purpose
  const float eps = 1e-6f;

  auto proj = rng.normals(size_t(T) * stride, 2.0f);
  auto qn = rng.normals(size_t(c.D), 0.3f), kn = rng.normals(size_t(c.D), 0.3f);
  auto iqn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f), ikn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f);

  native::KvCacheShape shape;
  shape.num_layers = 1;
  shape.num_blocks = sc.num_blocks;
  shape.block_size = c.bs;
  shape.kv_heads = c.KV;
  shape.head_dim = c.D;
  shape.index_dim = sparse ? c.ID : 0;
  shape.kv_dtype = c.kv;
  shape.ik_dtype = c.ik;
  shape.has_index = {uint8_t(sparse)};
  native::DeviceKvCache cache(shape);
  float ks = c.kv == DType::BF16 ? 1.f : fp8_scale_for(6.f, rng);
  float vs = c.kv == DType::BF16 ? 1.f : fp8_scale_for(10.f, rng);
  float iks = c.ik == DType::BF16 ? 1.f : fp8_scale_for(6.f, rng);
  cache.set_scales(0, ks, vs, iks);
  cache.fill(0xff, nullptr);
  auto view = cache.layer(0);

  native::DeviceStepMetadata dmeta(T, int(c.seqs.size()), meta.table_width);
  dmeta.upload(meta, nullptr);
  native::DeviceRope rope(c.rot, c.theta);
  DevBuf<float> d_proj(proj), d_qn(qn), d_kn(kn), d_iqn(iqn), d_ikn(ikn);
  DevBuf<float> q_out(size_t(T) * c.H * c.D), iq_out(size_t(T) * std::max(c.IH, 1) * std::max(c.ID, 1));
  q_out.poison();
  iq_out.poison();

  native::QkNormRopeArgs a;
  a.proj = d_proj.p;
  a.proj_stride = stride;
  a.num_heads = c.H;
  a.kv_heads = c.KV;
  a.head_dim = c.D;
  a.index_heads = c.IH;
  a.index_dim = sparse ? c.ID : 0;
  a.rotary_dim = c.rot;
  a.eps = eps;
  a.q_norm = d_qn.p;
  a.k_norm = d_kn.p;
  a.iq_norm = sparse ? d_iqn.p : nullptr;
  a.ik_norm = sparse ? d_ikn.p : nullptr;
  a.inv_freq = rope.inv_freq();
  a.q_out = q_out.p;
  a.iq_out = sparse ? iq_out.p : nullptr;
  native::qk_norm_rope_cache(a, dmeta.view(), view, nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());

  // Reference.
  ref::Rope rr(c.rot, c.theta);
  std::vector<float> rq(size_t(T) * c.H * c.D), riq(size_t(T) * std::max(c.IH, 1) * std::max(c.ID, 1));
  std::vector<float> rk(size_t(T) * c.KV * c.D), rv(size_t(T) * c.KV * c.D), rik(size_t(T) * std::max(c.ID, 1));
  for (int t = 0; t < T; ++t) {
    const float* row = proj.data() + size_t(t) * stride;
    int64_t pos = std::max(meta.positions[size_t(t)], 0);
    for (int h = 0; h < c.H; ++h) {
      float* y = rq.data() + (size_t(t) * c.H + h) * c.D;
      ref::gemma_rms_norm(row + h * c.D, qn.data(), c.D, eps, y);
      rr.apply(y, pos);
    }
    for (int g = 0; g < c.KV; ++g) {
      float* y = rk.data() + (size_t(t) * c.KV + g) * c.D;
      ref::gemma_rms_norm(row + (c.H + g) * c.D, kn.data(), c.D, eps, y);
      rr.apply(y, pos);
      std::copy_n(row + (c.H + c.KV + g) * c.D, c.D, rv.data() + (size_t(t) * c.KV + g) * c.D);
    }
    if (sparse) {
      const float* ib = row + (c.H + 2 * c.KV) * c.D;
      for (int g = 0; g < c.IH; ++g) {
        float* y = riq.data() + (size_t(t) * c.IH + g) * c.ID;
        ref::gemma_rms_norm(ib + g * c.ID, iqn.data(), c.ID, eps, y);
        rr.apply(y, pos);
      }
      float* y = rik.data() + size_t(t) * c.ID;
      ref::gemma_rms_norm(ib + c.IH * c.ID, ikn.data(), c.ID, eps, y);
      rr.apply(y, pos);
    }
  }
  // q / iq rows (padding rows too: rotated as position 0). fp32 sum of squares, reciprocal root
  // and rotation against the reference's double: a few ulp of values up to ~10.
  {
    auto got = q_out.download();
    SCOPED_TRACE("q_out");
    EXPECT_CLOSE(got, rq, 2e-5, 2e-5);
  }
  if (sparse) {
    auto got = iq_out.download();
    SCOPED_TRACE("iq_out");
    EXPECT_CLOSE(got, riq, 2e-5, 2e-5);
  }

  // Cache entries. One storage rounding: relative 2^-4 (E4M3) / 2^-8 (BF16) half-steps, plus the
  // subnormal half-step 2^-10 * scale for E4M3; 1e-5 relative slack for the fp32-vs-double input.
  // E4M3 saturates (core/codecs.h: |x| past the largest finite 448 stores 448): the reference of
  // an entry is its value clamped to +-448 * scale (the random rows reach past the scale's
  // nominal amax now and then: about 8% of the runs failed before the clamp, every time by
  // saturation: got 448 * scale).
  auto check_cache = [&](const char* what, DType dt, float scale, const void* dptr, size_t bytes, int rows_per_slot,
                         int width_per_row, const std::vector<float>& ref_rows) {
    SCOPED_TRACE(what);
    std::vector<uint8_t> img(bytes);
    M3_CUDA_CHECK(cudaMemcpy(img.data(), dptr, bytes, cudaMemcpyDeviceToHost));
    const size_t eb = elem_bytes(dt);
    const size_t slot_elems = size_t(rows_per_slot) * width_per_row;
    std::vector<float> got, want;
    size_t exact = 0, total = 0;
    std::set<int32_t> written;
    for (int t = 0; t < meta.num_live; ++t) {
      int32_t slot = meta.slots[size_t(t)];
      written.insert(slot);
      for (size_t e = 0; e < slot_elems; ++e) {
        const uint8_t* src = img.data() + (size_t(slot) * slot_elems + e) * eb;
        float r = ref_rows[size_t(t) * slot_elems + e];
        if (dt == DType::F8_E4M3) r = std::clamp(r, -448.0f * scale, 448.0f * scale);
        got.push_back(decode_elem(dt, src) * scale);
        want.push_back(r);
        uint8_t enc[2];
        encode_elem(dt, r / scale, enc);
        exact += std::memcmp(enc, src, eb) == 0;
        ++total;
      }
    }
    const bool f8 = dt == DType::F8_E4M3;
    EXPECT_CLOSE(got, want, f8 ? std::ldexp(double(scale), -10) : 1e-30, (f8 ? 0.0625 : 1.0 / 256) + 1e-5);
    EXPECT_GE(double(exact), 0.99 * double(total)) << exact << " of " << total << " stored elements bit-exact";
    // Never written: slots of no live row (padding rows have slot -1) keep the poison.
    size_t bad = 0, first_bad = 0;
    for (size_t s = 0; s < size_t(sc.num_blocks) * c.bs; ++s) {
      if (written.count(int32_t(s))) continue;
      for (size_t b = 0; b < slot_elems * eb; ++b)
        if (img[s * slot_elems * eb + b] != 0xff) {
          if (!bad) first_bad = s;
          ++bad;
        }
    }
    EXPECT_EQ(bad, 0u) << "bytes changed in unwritten slots, first slot " << first_bad;
  };
  check_cache("K cache", c.kv, ks, view.k, shape.kv_bytes(), c.KV, c.D, rk);
  check_cache("V cache", c.kv, vs, view.v, shape.kv_bytes(), c.KV, c.D, rv);
  if (sparse) check_cache("IK cache", c.ik, iks, view.ik, shape.ik_bytes(), 1, c.ID, rik);
}

}  // namespace

TEST(GpuRopeCache, RealShapesSparseFp8) {
  run_case({"real sparse fp8", 64, 4, 128, 4, 128, 64, 128, DType::F8_E4M3, DType::F8_E4M3,
            {{0, 3}, {126, 5}, {5000, 1}, {40000, 2}}, 3});
}
TEST(GpuRopeCache, RealShapesFullBf16) {
  run_case({"real full bf16", 64, 4, 128, 0, 0, 64, 128, DType::BF16, DType::BF16, {{0, 2}, {300, 17}}, 2});
}
TEST(GpuRopeCache, OddShapes) {
  run_case({"odd fp8/bf16", 8, 2, 64, 2, 64, 16, 16, DType::F8_E4M3, DType::BF16, {{0, 1}, {14, 4}, {100, 20}}, 3});
  run_case({"odd 80-dim", 6, 3, 80, 3, 48, 24, 8, DType::BF16, DType::F8_E4M3, {{5, 9}, {0, 1}}, 1, 1e4});
}
