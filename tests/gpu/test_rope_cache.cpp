// Fused q/k norm + partial RoPE + cache insert (native/qk_norm_rope.h) against the CPU reference
// ops (ref::gemma_rms_norm, ref::Rope): q and iq rows elementwise; K, V and index-K cache entries
// decoded and compared within one storage rounding step (and nearly all bit-exact); every slot not
// written by a live row (padding rows have slot -1) still holds the poison bytes.
#include <algorithm>
#include <memory>
#include <set>

#include "act_split_host.h"
#include "common/compare.h"
#include "native/linear.h"
#include "native/mma_rope.h"
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

// The one-layer cache of case c's heads over num_blocks blocks.
native::KvCacheShape cache_shape(const RopeCase& c, int num_blocks) {
  const bool sparse = c.IH > 0;
  native::KvCacheShape shape;
  shape.num_layers = 1;
  shape.num_blocks = num_blocks;
  shape.block_size = c.bs;
  shape.kv_heads = c.KV;
  shape.head_dim = c.D;
  shape.index_dim = sparse ? c.ID : 0;
  shape.kv_dtype = c.kv;
  shape.ik_dtype = c.ik;
  shape.has_index = {uint8_t(sparse)};
  return shape;
}

// The rope op's arguments of case c over proj rows of `stride` floats (norm weights: q, k, iq, ik).
native::QkNormRopeArgs rope_args(const RopeCase& c, const float* proj, int64_t stride, const float* const (&norms)[4],
                                 const float* inv_freq, float* q_out, float* iq_out, float eps) {
  const bool sparse = c.IH > 0;
  native::QkNormRopeArgs a;
  a.proj = proj;
  a.proj_stride = stride;
  a.num_heads = c.H;
  a.kv_heads = c.KV;
  a.head_dim = c.D;
  a.index_heads = c.IH;
  a.index_dim = sparse ? c.ID : 0;
  a.rotary_dim = c.rot;
  a.eps = eps;
  a.q_norm = norms[0];
  a.k_norm = norms[1];
  a.iq_norm = sparse ? norms[2] : nullptr;
  a.ik_norm = sparse ? norms[3] : nullptr;
  a.inv_freq = inv_freq;
  a.q_out = q_out;
  a.iq_out = sparse ? iq_out : nullptr;
  return a;
}

void run_case(const RopeCase& c) {
  Rng rng;
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << rng.seed);
  Scenario sc = make_padded_scenario(c.seqs, c.bs, c.pad, rng.gen);
  const auto& meta = sc.meta;
  const int T = meta.num_tokens;
  const bool sparse = c.IH > 0;
  const int width = (c.H + 2 * c.KV) * c.D + (sparse ? (c.IH + 1) * c.ID : 0);
  const int stride = width + 3;  // rows not 16-byte aligned on purpose
  const float eps = 1e-6f;

  auto proj = rng.normals(size_t(T) * stride, 2.0f);
  auto qn = rng.normals(size_t(c.D), 0.3f), kn = rng.normals(size_t(c.D), 0.3f);
  auto iqn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f), ikn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f);

  const native::KvCacheShape shape = cache_shape(c, sc.num_blocks);
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

  const native::QkNormRopeArgs a =
      rope_args(c, d_proj.p, stride, {d_qn.p, d_kn.p, d_iqn.p, d_ikn.p}, rope.inv_freq(), q_out.p, iq_out.p, eps);
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

namespace {

// The qkv projection whose last item of each head ropes it (native/mma_rope.h, kernels/mma_rope.cuh)
// against the projection then the rope op on the same inputs: bitwise the same projection rows, q
// and iq rows (padding rows too) and every byte of the K, V and index-K caches (poisoned alike
// first), over three launches with new activations each, the arrival counters all back at 0 after
// every launch.
struct FusedCase {
  RopeCase c;
  int hidden;
  bool nin;  // the projection applies the input norm's inv (as the decode plan's qkv does)
};

void run_fused_case(const FusedCase& f) {
  const RopeCase& c = f.c;
  Rng rng;
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << rng.seed);
  Scenario sc = make_padded_scenario(c.seqs, c.bs, c.pad, rng.gen);
  const auto& meta = sc.meta;
  const int T = meta.num_tokens, K = f.hidden;
  ASSERT_LE(T, native::kMmaDecodeRows);
  const bool sparse = c.IH > 0;
  const int N = (c.H + 2 * c.KV) * c.D + (sparse ? (c.IH + 1) * c.ID : 0);
  const int64_t stride = (N + 3) / 4 * 4, ldw = (K + 15) / 16 * 16, ldx = (K + 3) / 4 * 4;

  // FP8 E4M3 codes (no NaN codes 0x7f / 0xff), row scales, norm weights
  std::vector<uint8_t> codes(size_t(N) * size_t(ldw), 0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      uint8_t b = uint8_t(rng.uniform_int(0, 255));
      if ((b & 0x7f) == 0x7f) b &= 0xfe;
      codes[size_t(n) * size_t(ldw) + size_t(k)] = b;
    }
  std::vector<float> scales(static_cast<size_t>(N));
  for (auto& v : scales) v = rng.uniform(0.5f, 2.0f) / 256.0f;
  DevBuf<uint8_t> d_codes(codes);
  DevBuf<float> d_scales(scales);
  auto qn = rng.normals(size_t(c.D), 0.3f), kn = rng.normals(size_t(c.D), 0.3f);
  auto iqn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f), ikn = rng.normals(size_t(std::max(c.ID, 1)), 0.3f);
  DevBuf<float> d_qn(qn), d_kn(kn), d_iqn(iqn), d_ikn(ikn);
  std::vector<float> inv(static_cast<size_t>(T));
  for (auto& v : inv) v = std::exp2(rng.normal());
  DevBuf<float> d_inv(inv);

  const native::KvCacheShape shape = cache_shape(c, sc.num_blocks);
  const float ks = c.kv == DType::BF16 ? 1.f : fp8_scale_for(6.f, rng);
  const float vs = c.kv == DType::BF16 ? 1.f : fp8_scale_for(10.f, rng);
  const float iks = c.ik == DType::BF16 ? 1.f : fp8_scale_for(6.f, rng);
  native::DeviceStepMetadata dmeta(T, int(c.seqs.size()), meta.table_width);
  dmeta.upload(meta, nullptr);
  native::DeviceRope rope(c.rot, c.theta);
  DevBuf<float> d_x(size_t(T) * size_t(ldx));
  DevBuf<uint16_t> d_xs(size_t(T) * size_t(2 * ldx));

  // One side: its projection rows, q / iq rows and caches.
  struct Side {
    native::DeviceKvCache cache;
    DevBuf<float> proj, q, iq;
    kernels::MmaLinearParams mma;
    kernels::QkNormRopeCacheParams rope;
    Side(const native::KvCacheShape& sh, int T, int64_t stride, int qd, int iqd)
        : cache(sh), proj(size_t(T) * size_t(stride)), q(size_t(T) * size_t(qd)), iq(size_t(T) * size_t(std::max(iqd, 1))) {}
  };
  auto make_side = [&]() {
    auto s = std::make_unique<Side>(shape, T, stride, c.H * c.D, c.IH * c.ID);
    s->cache.set_scales(0, ks, vs, iks);
    s->mma = native::make_fp8_linear_params(native::Fp8Weight{d_codes.p, d_scales.p, N, K, ldw},
                                            native::ActIn{d_x.p, DType::F32, ldx}, T, s->proj.p, stride,
                                            native::MmaTiling{1, 1, false, 0});
    if (f.nin) s->mma.nin = kernels::NormIn{nullptr, d_inv.p, K, T, 1e-6f};
    EXPECT_TRUE(native::use_split_activations(s->mma, d_xs.p));
    const native::QkNormRopeArgs a = rope_args(c, s->proj.p, stride, {d_qn.p, d_kn.p, d_iqn.p, d_ikn.p},
                                               rope.inv_freq(), s->q.p, s->iq.p, 1e-6f);
    s->rope = native::make_qk_norm_rope_params(a, dmeta.view(), s->cache.layer(0));
    return s;
  };
  auto two = make_side(), one = make_side();
  ASSERT_TRUE(kernels::mma_rope_fits(one->mma, one->rope));
  const int nvec = one->rope.vectors_per_token();
  DevBuf<int32_t> arrivals(static_cast<size_t>(nvec));
  arrivals.poison(0);
  const kernels::MmaRopeParams fused = native::make_mma_rope_params(one->mma, one->rope, arrivals.p);
  auto bytes_of = [](const void* p, size_t n) {
    std::vector<uint8_t> h(n);
    M3_CUDA_CHECK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
    return h;
  };
  auto expect_same = [&](const char* what, const void* a, const void* b, size_t n, int round) {
    const auto ha = bytes_of(a, n), hb = bytes_of(b, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (ha[i] != hb[i] && !bad++) first = i;
    EXPECT_EQ(bad, 0u) << what << " round " << round << ": " << bad << " of " << n << " bytes differ, the first at byte "
                       << first;
  };
  for (int round = 0; round < 3; ++round) {
    std::vector<float> x(size_t(T) * size_t(ldx), 0.f);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) x[size_t(t) * size_t(ldx) + size_t(k)] = rng.normal();
    d_x.upload(x);
    const auto xs = split_rows_host(x, T, K, ldx);
    d_xs.upload(xs);
    for (Side* s : {two.get(), one.get()}) {
      s->cache.fill(0xff, nullptr);
      s->proj.poison();
      s->q.poison();
      s->iq.poison();
    }
    native::launch(two->mma, nullptr);
    native::launch(two->rope, nullptr);
    native::launch(fused, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    const auto arr = arrivals.download();
    for (int v = 0; v < nvec; ++v) ASSERT_EQ(arr[size_t(v)], 0) << "round " << round << ": vector " << v << "'s counter";
    expect_same("projection rows", two->proj.p, one->proj.p, two->proj.n * 4, round);
    expect_same("q rows", two->q.p, one->q.p, two->q.n * 4, round);
    if (sparse) expect_same("iq rows", two->iq.p, one->iq.p, two->iq.n * 4, round);
    const auto v2 = two->cache.layer(0), v1 = one->cache.layer(0);
    expect_same("K cache", v2.k, v1.k, shape.kv_bytes(), round);
    expect_same("V cache", v2.v, v1.v, shape.kv_bytes(), round);
    if (sparse) expect_same("index-K cache", v2.ik, v1.ik, shape.ik_bytes(), round);
    // and the fused run wrote something: the live rows' q are finite (the poison is NaN)
    const auto q = one->q.download();
    size_t nonfinite = 0;
    for (int t = 0; t < meta.num_live; ++t)
      for (int i = 0; i < c.H * c.D; ++i) nonfinite += !std::isfinite(q[size_t(t) * c.H * c.D + i]);
    EXPECT_EQ(nonfinite, 0u) << "round " << round;
  }
}

}  // namespace

TEST(GpuRopeCache, QkvThatRopesEqualsQkvThenRope) {
  // one TP-4 rank of the real model (16 q heads, one KV group, one index head; 160 tiles of 6144)
  run_fused_case({{"real rank, b=1", 16, 1, 128, 1, 128, 64, 128, DType::F8_E4M3, DType::F8_E4M3, {{5000, 1}}, 0}, 6144, true});
  run_fused_case({{"real rank, 3 rows + padding", 16, 1, 128, 1, 128, 64, 128, DType::BF16, DType::F8_E4M3,
                   {{0, 1}, {126, 1}, {40000, 1}}, 1},
                  6144, false});
  run_fused_case(
      {{"verify rows of 4", 8, 2, 128, 2, 128, 64, 16, DType::F8_E4M3, DType::BF16, {{10, 4}, {300, 4}}, 0}, 1024, true});
  run_fused_case({{"full attention, 64-dim heads", 8, 2, 64, 0, 0, 32, 16, DType::BF16, DType::BF16, {{7, 2}, {0, 1}}, 2,
                   1e4},
                  512, false});
}
