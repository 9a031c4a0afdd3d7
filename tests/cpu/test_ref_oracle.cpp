// The CPU reference as the GPU's oracle (ref/cache_codec.h, ref/follow.h):
// - the cache codec emulation against the weight quantizer (bitwise, power-of-two scales), a
//   brute-force nearest-code search (any scale) and every FP8 code (round trip), BF16 against a
//   brute-force nearest-even; bad options rejected;
// - the reference with emulated caches against the independent float64 model (tests/common/
//   naive_model) whose K/V/index-K are rounded the same way; the default stays exact;
// - decision following: the gap rule on constructed scores (near-ties within the tolerance taken,
//   larger gaps, dropped local blocks and invalid choices refused), and in the engine: its own
//   decisions change nothing, exact ties (identical keys, identical router rows) are followed,
//   far choices are refused (own kept, output bitwise unchanged) unless the tolerance is opened.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/compare.h"
#include "common/naive_model.h"
#include "common/random.h"
#include "core/check.h"
#include "core/codecs.h"
#include "model/quantize.h"
#include "ref/cache_codec.h"
#include "ref/engine.h"
#include "ref/follow.h"

using namespace m3;
using m3::test::fresh_seed;

namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Brute force: the E4M3 code of y's sign whose value is nearest to y (ties to the even code),
// over the finite codes only (so anything past 448 saturates).
uint8_t nearest_e4m3(float y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const double a = std::fabs(double(y));
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(double(e4m3_to_f32(uint8_t(c))) - a);
    if (d < bd || (d == bd && (c & 1) == 0)) {
      bd = d;
      best = c;
    }
  }
  return uint8_t(sign | best);
}

// Brute force bf16 round to nearest even through double distances.
float nearest_bf16(float x) {
  const uint32_t lo = bits(x) & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dl = std::fabs(double(x) - flo), dh = std::fabs(double(fhi) - x);
  if (dl < dh) return flo;
  if (dh < dl) return fhi;
  return (lo & 0x10000u) ? fhi : flo;
}

std::unique_ptr<ref::RefBackend> ref_backend(const ModelSpec& s, const ModelWeights& w, int blocks,
                                             ref::CacheEmulation cache = {}) {
  ref::RefOptions o;
  o.num_cache_blocks = blocks;
  o.threads = 2;
  o.cache = std::move(cache);
  return ref::make_ref_backend(s, w, o);
}

StepBatch prompt_batch(const std::vector<int32_t>& toks, int blocks) {
  SeqStep q;
  q.tokens = toks;
  q.block_table.resize(size_t(blocks));
  std::iota(q.block_table.begin(), q.block_table.end(), 0);
  q.all_logits = true;
  return StepBatch{{q}};
}

}  // namespace

// ---- the codec ----

TEST(CacheCodec, Fp8EveryCodeRoundTrips) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ls(-4.0f, 4.0f);
  for (int trial = 0; trial < 20; ++trial) {
    const float s = trial < 5 ? std::ldexp(1.0f, trial - 2) : std::exp2(ls(rng));
    const auto c = ref::CacheCodec::make(DType::F8_E4M3, s);
    for (int code = 0; code < 256; ++code) {
      const float v = e4m3_to_f32(uint8_t(code));
      if (std::isnan(v)) continue;
      const float x = v * s;  // what a read of this code returns
      ASSERT_EQ(bits(c.round(x)), bits(x)) << "scale " << s << " code " << code;
    }
  }
}

TEST(CacheCodec, Fp8MatchesQuantizerAndNearestCode) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  // power-of-two scales: the weight quantizer (x / scale) and the cache (x * (1 / scale)) agree
  // exactly, so the codes must be bitwise the same
  for (int trial = 0; trial < 50; ++trial) {
    const float s = std::ldexp(1.0f, int(rng() % 13) - 6);
    const int n = 64;
    std::vector<float> x(static_cast<size_t>(n));
    const float spread = std::exp2(float(int(rng() % 16) - 8));
    for (auto& v : x) v = std::clamp(nd(rng) * spread * s * 100, -448 * s, 448 * s);
    x[rng() % n] = (rng() & 1 ? 448 : -448) * s;  // amax 448 s: the quantizer's scale is s exactly
    std::vector<uint8_t> codes(size_t(fp8_row_bytes(n)));
    ASSERT_EQ(quantize_fp8_row(x.data(), n, codes.data()), s);
    std::vector<float> deq(static_cast<size_t>(n));
    dequantize_fp8_row(codes.data(), s, n, deq.data());
    const auto c = ref::CacheCodec::make(DType::F8_E4M3, s);
    for (int i = 0; i < n; ++i) ASSERT_EQ(bits(c.round(x[size_t(i)])), bits(deq[size_t(i)])) << "x " << x[size_t(i)];
  }
  // any scale, values across the whole range (subnormals, saturation): the GPU's recipe
  // e4m3(x * fp32(1 / s)) * s with the code found by brute force
  std::uniform_real_distribution<float> ls(-6.0f, 6.0f), le(-14.0f, 11.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    const float s = std::exp2(ls(rng));
    const float x = (rng() & 1 ? 1.0f : -1.0f) * std::exp2(le(rng)) * s;
    const float inv = 1.0f / s;
    const float want = e4m3_to_f32(nearest_e4m3(x * inv)) * s;
    ASSERT_EQ(bits(ref::CacheCodec::make(DType::F8_E4M3, s).round(x)), bits(want)) << "x " << x << " scale " << s;
  }
}

TEST(CacheCodec, Bf16IsNearestEven) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto c = ref::CacheCodec::make(DType::BF16);
  for (int trial = 0; trial < 100000; ++trial) {
    // random bits with an exponent below 2^126 (no overflow to inf), ties included by construction
    uint32_t u = uint32_t(rng());
    u = (u & 0x80000000u) | ((u >> 1) % 0x7e800000u & 0x7fffffffu);
    if (trial % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // an exact tie
    float x;
    std::memcpy(&x, &u, 4);
    ASSERT_EQ(bits(c.round(x)), bits(nearest_bf16(x))) << std::hex << u;
  }
  EXPECT_EQ(ref::CacheCodec{}.round(0.1f), 0.1f);  // F32: exact
}

TEST(CacheCodec, RejectsBadOptions) {
  EXPECT_THROW(ref::CacheCodec::make(DType::F16), Error);
  EXPECT_THROW(ref::CacheCodec::make(DType::F8_E4M3, 0.0f), Error);
  EXPECT_THROW(ref::CacheCodec::make(DType::F8_E4M3, -1.0f), Error);
  EXPECT_THROW(ref::CacheCodec::make(DType::F8_E4M3, NAN), Error);
  EXPECT_THROW(ref::CacheCodec::make(DType::BF16, 2.0f), Error);
  EXPECT_THROW(ref::CacheCodec::make(DType::F32, 0.5f), Error);
  ModelSpec s = m3::test::small_spec();
  ref::CacheEmulation e;
  e.kv_dtype = DType::F8_E4M3;
  e.k_scales = {1.0f, 2.0f};  // 2 entries for 3 layers
  EXPECT_THROW(ref::make_cache_codecs(s, e), Error);
  e.k_scales = {1.0f, 2.0f, 0.5f};
  auto c = ref::make_cache_codecs(s, e);
  EXPECT_EQ(c.k[1].scale, 2.0f);
  EXPECT_EQ(c.v[1].scale, 1.0f);
  EXPECT_TRUE(c.ik[1].exact());  // ik_dtype left at F32
  EXPECT_FALSE(c.exact());
}

// ---- the reference with emulated caches ----

TEST(RefCacheEmulation, MatchesNaiveModelWithRoundedCaches) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ls(-1.0f, 1.0f);
  int done = 0;
  double worst = 0, moved = 0;
  for (int attempt = 0; attempt < 80 && done < 6; ++attempt) {
    ModelSpec s = m3::test::random_spec(rng);
    ModelWeights w = m3::test::make_random_weights(s, rng());
    const int T = std::uniform_int_distribution<int>(2, std::min(24, (s.index_topk + 3) * s.index_block))(rng);
    auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
    ref::CacheEmulation e;
    e.kv_dtype = e.ik_dtype = DType::F8_E4M3;
    for (int l = 0; l < s.num_layers; ++l) {  // per-layer scales, one of them 1
      e.k_scales.push_back(l == 0 ? 1.0f : std::exp2(ls(rng)));
      e.v_scales.push_back(std::exp2(ls(rng)));
      e.ik_scales.push_back(std::exp2(ls(rng)));
    }
    const ref::CacheCodecs codecs = ref::make_cache_codecs(s, e);
    // the reference computes K/V/index-K in fp32 (~1e-7 relative from this float64 model): a value
    // that close to a rounding midpoint may round the other way there, so such draws are skipped
    bool near_midpoint = false;
    auto round = [&](char kind, int l, double x) {
      const ref::CacheCodec& c = kind == 'k' ? codecs.k[size_t(l)] : kind == 'v' ? codecs.v[size_t(l)] : codecs.ik[size_t(l)];
      const double band = 2e-6 * (1 + std::fabs(x));
      if (c.round(float(x - band)) != c.round(float(x + band))) near_midpoint = true;
      return double(c.round(float(x)));
    };
    auto want = m3::test::naive_forward(s, w, toks, round);
    if (near_midpoint || want.min_block_gap < 1e-4 || want.min_router_gap < 1e-5) continue;
    auto exact = m3::test::naive_forward(s, w, toks);
    ++done;
    const int blocks = (T + s.index_block - 1) / s.index_block;
    StepOutput got = ref_backend(s, w, blocks, e)->step(prompt_batch(toks, blocks));
    const int V = s.vocab_size;
    for (int t = 0; t < T; ++t) {
      std::span<const float> g(got.row(0, t), size_t(V));
      std::vector<float> r(want.logits.begin() + ptrdiff_t(size_t(t) * V), want.logits.begin() + ptrdiff_t(size_t(t + 1) * V));
      double mx = 0, dm = 0;
      for (int i = 0; i < V; ++i) {
        mx = std::max(mx, double(std::fabs(r[size_t(i)])));
        dm = std::max(dm, std::fabs(exact.logits[size_t(t) * V + i] - r[size_t(i)]));
      }
      auto c = m3::test::compare(g, r, 3e-6 * mx, 0.0);
      worst = std::max(worst, c.max_abs_err / mx);
      moved = std::max(moved, dm / mx);
      // as RefEngine.MatchesNaiveFp64ModelOnRandomShapes: fp32 activations vs fp64, worst ~2e-7
      EXPECT_TRUE(c.ok) << "token " << t << ": " << c.describe();
    }
  }
  EXPECT_GE(done, 3) << "too many draws skipped for near ties / midpoints";
  // the rounding itself moves the logits far more than the bound above (FP8: 2^-4 relative)
  EXPECT_GT(moved, 1e-3);
  std::printf("FP8-rounded caches: %d random shapes, reference vs rounded fp64 model worst %.3g of max|logit|; "
              "the rounding moves logits by up to %.3g\n", done, worst, moved);
}

// The default emulation changes nothing, and BF16 rounds what every layer writes, to the nearest
// even value. Checked on the cache entries themselves (SelectionTrace::record_cache) rather than on
// logits: downstream of the first rounding the random model is chaotic (a flipped near-tie block or
// expert choice moves a row arbitrarily far), so no logits tolerance both holds for every seed and
// catches a broken codec. Layer 0 is where the exact values are known: its K/V/index-K depend only
// on the embeddings and layer 0's weights, never on what a cache returned, so the independent
// float64 model (tests/common/naive_model) gives them, and every run computes the same fp32 values
// before its codec.
TEST(RefCacheEmulation, DefaultIsExactAndBf16Rounds) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  // small_spec with layer 0 sparse, so that the layer with known inputs has all three caches (and
  // a full-attention layer still follows)
  s.attn = {AttnKind::Sparse, AttnKind::Full, AttnKind::Sparse};
  ModelWeights w = m3::test::make_random_weights(s, rng());
  const int T = 30;
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  StepBatch b = prompt_batch(toks, 8);
  SelectionTrace tp, tf, tb;
  tp.record_cache = tf.record_cache = tb.record_cache = true;
  StepOutput plain = ref::make_ref_backend(s, w, ref::RefOptions{8, 2})->step(b, &tp);
  StepOutput f32 = ref_backend(s, w, 8, ref::CacheEmulation{})->step(b, &tf);
  ASSERT_EQ(tp.cache_k.size(), size_t(s.num_layers));
  ASSERT_EQ(tp.cache_ik[0].size(), size_t(T) * s.index_dim);
  ASSERT_TRUE(tp.cache_ik[1].empty());

  // an explicit default emulation is the very same computation as none, bitwise
  EXPECT_EQ(plain.logits, f32.logits);
  EXPECT_EQ(tp.cache_k, tf.cache_k);
  EXPECT_EQ(tp.cache_v, tf.cache_v);
  EXPECT_EQ(tp.cache_ik, tf.cache_ik);
  EXPECT_EQ(tp.blocks, tf.blocks);
  EXPECT_EQ(tp.experts, tf.experts);

  // and it is exact: layer 0's entries are the float64 model's values to fp32 accuracy. The naive
  // model hands every K, V, index-K element to its rounding callback in [token][element] order,
  // the trace's layout.
  std::vector<double> exact[3];  // K, V, index-K of layer 0
  m3::test::naive_forward(s, w, toks, [&](char kind, int l, double x) {
    if (l == 0) exact[kind == 'k' ? 0 : kind == 'v' ? 1 : 2].push_back(x);
    return x;
  });
  const std::vector<float>* dflt[3] = {&tf.cache_k[0], &tf.cache_v[0], &tf.cache_ik[0]};
  const int width[3] = {s.head_dim, s.head_dim, s.index_dim};  // one head's vector
  double worst = 0;
  for (int c = 0; c < 3; ++c) {
    ASSERT_EQ(exact[c].size(), dflt[c]->size()) << "cache " << c;
    for (size_t v0 = 0; v0 < exact[c].size(); v0 += size_t(width[c])) {
      double mx = 0;
      for (int i = 0; i < width[c]; ++i) mx = std::max(mx, std::fabs(exact[c][v0 + size_t(i)]));
      for (int i = 0; i < width[c]; ++i) {
        const double err = std::fabs(double((*dflt[c])[v0 + size_t(i)]) - exact[c][v0 + size_t(i)]) / mx;
        worst = std::max(worst, err);
        // fp32 norm / projection / RoPE of a 48-wide hidden state against float64: a few fp32
        // ulps, 1.7e-7 of the head vector's max|x| at worst over 300 seeds (printed below). 1e-5
        // keeps ~60x margin and is still 1/200 of BF16's half step (2^-9 of |x|), so a default
        // that rounded to BF16 (or anything coarser) fails on its entries near the max.
        ASSERT_LE(err, 1e-5) << "cache " << c << " entry " << v0 + size_t(i) << ": " << (*dflt[c])[v0 + size_t(i)]
                             << " vs float64 " << exact[c][v0 + size_t(i)];
      }
    }
  }
  std::printf("default cache emulation, layer 0 vs the float64 model: worst %.3g of the head's max|x|\n", worst);

  ref::CacheEmulation e;
  e.kv_dtype = e.ik_dtype = DType::BF16;
  StepOutput bf = ref_backend(s, w, 8, e)->step(b, &tb);
  EXPECT_NE(bf.logits, plain.logits);
  ASSERT_EQ(tb.cache_k.size(), size_t(s.num_layers));
  for (int l = 0; l < s.num_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const struct {
      const char* what;
      const std::vector<float>& got;
      const std::vector<float>& exact;
    } caches[3] = {{"K", tb.cache_k[size_t(l)], tp.cache_k[size_t(l)]},
                   {"V", tb.cache_v[size_t(l)], tp.cache_v[size_t(l)]},
                   {"index-K", tb.cache_ik[size_t(l)], tp.cache_ik[size_t(l)]}};
    for (const auto& c : caches) {
      ASSERT_EQ(c.got.size(), c.exact.size()) << c.what;
      ASSERT_EQ(c.got.size() == 0, std::strcmp(c.what, "index-K") == 0 && !s.sparse(l)) << c.what;
      size_t changed = 0;
      for (size_t i = 0; i < c.got.size(); ++i) {
        // every layer: what the cache returns is a BF16 value (the low 16 bits of its fp32 are 0)
        ASSERT_EQ(bits(c.got[i]) & 0xffffu, 0u) << c.what << " entry " << i << " = " << c.got[i];
        // layer 0: the nearest-even BF16 of the exact value (brute force, independent of the codec)
        if (l == 0) {
          ASSERT_EQ(bits(c.got[i]), bits(nearest_bf16(c.exact[i])))
              << c.what << " entry " << i << ": exact " << c.exact[i] << " read back " << c.got[i];
          changed += bits(c.got[i]) != bits(c.exact[i]);
        }
      }
      // and the rounding is visible there: a random fp32 value is already a BF16 value with
      // probability 2^-16, so nearly every entry must have changed (not just "some")
      if (l == 0) EXPECT_GT(changed, c.got.size() * 9 / 10) << c.what;
    }
  }
}

// ---- the gap rule ----

TEST(RefFollow, BlockGapRule) {
  // blocks 0..4, query in block 4 (local), top 3; own choice {0, 1, 4}
  const float sc[5] = {2.0f, 1.0f, 1.0f - 2e-6f, 0.5f, -1.0f};
  int calls = 0;
  auto unit = [&](int) { ++calls; return 1.0; };
  auto gap = [&](std::vector<int32_t> off, std::function<double(int)> m) {
    return ref::block_choice_gap(sc, 5, 4, 3, 1, off, m);
  };
  EXPECT_EQ(gap({0, 1, 4}, unit), 0.0);
  EXPECT_EQ(calls, 0);  // no violating pair, no magnitude needed
  const double g = gap({0, 2, 4}, unit);  // swaps 1 and 2: (1 - (1 - 2e-6)) / (1 + 1)
  EXPECT_NEAR(g, double(1.0f - (1.0f - 2e-6f)) / 2, 1e-12);
  EXPECT_LE(g, ref::kTieRel);
  EXPECT_EQ(calls, 2);
  EXPECT_GT(gap({0, 2, 4}, [](int) { return 0.01; }), ref::kTieRel);  // the same gap on smaller dot products
  EXPECT_NEAR(gap({0, 3, 4}, unit), 0.25, 1e-12);  // 1 left out for 3
  EXPECT_NEAR(gap({1, 2, 4}, unit), (2.0 - double(1.0f - 2e-6f)) / 2, 1e-9);  // 0 left out for 2
  EXPECT_EQ(gap({0, 1, 3}, unit), INFINITY);  // drops the local block
  EXPECT_EQ(gap({0, 1}, unit), INFINITY);     // wrong size
  EXPECT_EQ(gap({0, 0, 4}, unit), INFINITY);  // duplicate
  EXPECT_EQ(gap({0, 1, 5}, unit), INFINITY);  // out of range
  const float nan_sc[3] = {1.0f, NAN, 0.5f};  // a NaN block is never kept
  EXPECT_EQ(ref::block_choice_gap(nan_sc, 3, 2, 2, 1, {1, 2}, unit), INFINITY);
  EXPECT_EQ(ref::block_choice_gap(nan_sc, 3, 2, 2, 1, {0, 2}, unit), 0.0);
  const float two[2] = {0.3f, 0.1f};  // fewer blocks than top-k: all of them
  EXPECT_EQ(ref::block_choice_gap(two, 2, 1, 3, 1, {0, 1}, unit), 0.0);
  EXPECT_EQ(ref::block_choice_gap(two, 2, 1, 3, 1, {1}, unit), INFINITY);
}

TEST(RefFollow, ExpertGapRule) {
  const double ch[4] = {0.9, 0.8, 0.8 - 1e-6, 0.1};
  const double m[4] = {0.25, 0.25, 0.25, 0.25};
  auto gap = [&](std::vector<int32_t> off) { return ref::expert_choice_gap(ch, m, 4, 2, off); };
  EXPECT_EQ(gap({0, 1}), 0.0);
  EXPECT_NEAR(gap({0, 2}), 1e-6 / 0.5, 1e-12);
  EXPECT_LE(gap({0, 2}), ref::kTieRel);
  EXPECT_NEAR(gap({1, 0}), 0.1 / 0.5, 1e-12);  // order matters: 0 ranks above 1
  EXPECT_NEAR(gap({0, 3}), 0.7 / 0.5, 1e-12);
  EXPECT_EQ(gap({0}), INFINITY);
  EXPECT_EQ(gap({0, 0}), INFINITY);
  EXPECT_EQ(gap({0, 7}), INFINITY);
}

TEST(RefFollow, CacheRoundingRule) {
  ref::FollowCount n;
  float dst[4];
  for (DType dt : {DType::F8_E4M3, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const auto c = ref::CacheCodec::make(dt);
    // the two codes around 1: FP8 1 and 1.125, BF16 1 and 1 + 2^-7; x on their midpoint (rounds to
    // the even one, 1), a vector of rms ~1
    const float up = dt == DType::F8_E4M3 ? 1.125f : 1.0f + 0x1p-7f, mid = (1.0f + up) / 2;
    auto run = [&](float x, float offered) {
      const float v[4] = {x, 1, -1, 1}, off[4] = {offered, 1, -1, 1};
      n = {};
      ref::store_following(c, v, 4, off, ref::kCacheTieRel, dst, n);
      return dst[0];
    };
    EXPECT_EQ(run(mid, up), up);  // a tie: the other rounding is taken
    EXPECT_EQ(n.followed, 1);
    EXPECT_EQ(n.offered, 4);
    EXPECT_EQ(run(std::nextafter(mid, 0.0f), up), up);  // one fp32 ulp below: still within kCacheTieRel rms
    EXPECT_EQ(n.followed, 1);
    EXPECT_EQ(run(mid - 1e-4f, up), 1.0f);  // 1e-4 of the rms away: refused
    EXPECT_EQ(n.refused, 1);
    EXPECT_GT(n.min_refused, ref::kCacheTieRel);
    EXPECT_NEAR(n.min_refused, 1e-4 / std::sqrt(3.0 / 4 + mid * mid / 4), 1e-6);
    EXPECT_EQ(run(mid, dt == DType::F8_E4M3 ? 1.25f : 1.0f + 0x1p-6f), 1.0f);  // two codes away: refused
    EXPECT_EQ(n.refused, 1);
    EXPECT_EQ(run(mid, 1.0f), 1.0f);  // the own rounding: nothing to decide
    EXPECT_EQ(n.differ, 0);
    EXPECT_EQ(run(mid, NAN), 1.0f);  // an unwritten (NaN) entry is never taken
    EXPECT_EQ(n.refused, 1);
  }
  // an element small next to its vector (rms ~1): rounding noise of kCacheTieRel of the rms spans several
  // BF16 codes there, and any of them within that distance is taken
  {
    const auto c = ref::CacheCodec::make(DType::BF16);
    const float x = 1e-4f, v[4] = {x, 1, -1, 1};
    const float near = bf16_to_f32(uint16_t(f32_to_bf16(x) + 3));  // 3 codes up, ~1.4e-6 away
    const float far = bf16_to_f32(uint16_t(f32_to_bf16(x) + 200));  // ~1e-4 away
    for (auto [o, taken] : {std::pair{near, true}, std::pair{far, false}}) {
      const float off[4] = {o, 1, -1, 1};
      n = {};
      ref::store_following(c, v, 4, off, ref::kCacheTieRel, dst, n);
      EXPECT_EQ(dst[0], taken ? o : c.round(x)) << o;
      EXPECT_EQ(n.followed, taken ? 1 : 0);
      EXPECT_EQ(n.refused, taken ? 0 : 1);
    }
    const float off[4] = {1.5e-4f, 1, -1, 1};  // not a value BF16 stores: refused
    n = {};
    ref::store_following(c, v, 4, off, 1e300, dst, n);
    EXPECT_EQ(n.refused, 1);
  }
  // with a scale: the rule works on the scaled grid (FP8 codes 1 and 1.125 times 0.5)
  const auto c = ref::CacheCodec::make(DType::F8_E4M3, 0.5f);
  const float v[2] = {0.53125f, 0.5f}, off[2] = {0.5625f, 0.5f};
  n = {};
  ref::store_following(c, v, 2, off, ref::kCacheTieRel, dst, n);
  EXPECT_EQ(dst[0], 0.5625f);
  EXPECT_EQ(n.followed, 1);
  // no offer: a plain store
  ref::store_following(c, v, 2, nullptr, ref::kCacheTieRel, dst, n);
  EXPECT_EQ(dst[0], 0.5f);
}

// ---- following in the engine ----

TEST(RefFollow, OwnDecisionsChangeNothing) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  const int T = 30;
  auto toks = m3::test::random_tokens(T, s.vocab_size, rng);
  StepBatch b = prompt_batch(toks, 8);
  ref::CacheEmulation fp8;
  fp8.kv_dtype = fp8.ik_dtype = DType::F8_E4M3;
  fp8.k_scale = 0.25f;
  SelectionTrace own;
  own.record_cache = true;
  StepOutput a = ref_backend(s, w, 8, fp8)->step(b, &own);
  EXPECT_EQ(own.moe_layers, (std::vector<int>{1, 2}));
  ASSERT_EQ(own.cache_k.size(), 3u);
  EXPECT_EQ(own.cache_k[0].size(), size_t(T) * s.kv_dim());
  EXPECT_EQ(own.cache_v[2].size(), size_t(T) * s.kv_dim());
  EXPECT_TRUE(own.cache_ik[0].empty());  // full-attention layer
  EXPECT_EQ(own.cache_ik[1].size(), size_t(T) * s.index_dim);
  for (float x : own.cache_k[1])  // FP8 codes times the scale
    ASSERT_EQ(x, e4m3_to_f32(f32_to_e4m3(x * 4.0f)) * 0.25f);
  ASSERT_EQ(own.experts.size(), 2u);
  ASSERT_EQ(own.experts[0].size(), size_t(T));
  EXPECT_EQ(own.experts[0][0].size(), size_t(s.top_k));
  ref::FollowStats st;
  SelectionTrace used;
  used.record_cache = true;
  StepOutput f = ref_backend(s, w, 8, fp8)->step_following(b, own, {}, &st, &used);
  EXPECT_EQ(f.logits, a.logits);
  EXPECT_EQ(used.blocks, own.blocks);
  EXPECT_EQ(used.experts, own.experts);
  EXPECT_EQ(used.cache_k, own.cache_k);
  EXPECT_EQ(used.cache_ik, own.cache_ik);
  EXPECT_EQ(st.block_sets, int64_t(T) * s.num_kv_heads * 2);
  EXPECT_EQ(st.expert_lists, int64_t(T) * 2);
  EXPECT_EQ(st.cache.offered, int64_t(T) * (3 * 2 * s.kv_dim() + 2 * s.index_dim));
  EXPECT_EQ(st.block_differ + st.expert_differ + st.cache.differ, 0);
  EXPECT_EQ(st.followed() + st.refused(), 0);
  // a cache entry offered one FP8 step away (its value is not on a rounding midpoint): refused,
  // the reference keeps its own and nothing changes
  SelectionTrace moved = own;
  float& e = moved.cache_ik[2][size_t(7 * s.index_dim + 3)];
  e = e4m3_to_f32(uint8_t(f32_to_e4m3(e) + 1));  // ik scale 1
  ref::FollowStats st3;
  EXPECT_EQ(ref_backend(s, w, 8, fp8)->step_following(b, moved, {}, &st3).logits, a.logits);
  EXPECT_EQ(st3.cache.refused, 1);
  EXPECT_EQ(st3.refused(), 1);
  EXPECT_NE(st3.first_refused.find("index-K"), std::string::npos) << st3.first_refused;
  // an offer of one kind only, and a malformed one
  SelectionTrace blocks_only = own;
  blocks_only.moe_layers.clear();
  blocks_only.experts.clear();
  blocks_only.cache_k.clear();
  blocks_only.cache_v.clear();
  blocks_only.cache_ik.clear();
  ref::FollowStats st2;
  EXPECT_EQ(ref_backend(s, w, 8, fp8)->step_following(b, blocks_only, {}, &st2).logits, a.logits);
  EXPECT_EQ(st2.expert_lists, 0);
  EXPECT_EQ(st2.cache.offered, 0);
  SelectionTrace bad = own;
  bad.blocks[0].pop_back();
  EXPECT_THROW(ref_backend(s, w, 8, fp8)->step_following(b, bad, {}, &st2), Error);
  bad = own;
  bad.cache_v[1].pop_back();
  EXPECT_THROW(ref_backend(s, w, 8, fp8)->step_following(b, bad, {}, &st2), Error);
}

TEST(RefFollow, ExactTiesAreFollowedFarChoicesRefused) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Layer 0 sparse without RoPE, 8 copies of one token then another: every position sees the same
  // keys, so index blocks 0 and 1 score exactly alike; top 2 with 1 local block: the query at
  // position 8 keeps block 2 and one of {0, 1} (its own: 0).
  ModelSpec s = m3::test::small_spec();
  s.attn = {AttnKind::Sparse, AttnKind::Sparse, AttnKind::Full};
  s.rotary_dim = 0;
  s.index_topk = 2;
  ModelWeights w = m3::test::make_random_weights(s, rng());
  // experts 0 and 1 of every MoE layer: identical router rows and a bias that always picks them,
  // so their choice scores tie exactly (own order: 0, 1)
  for (int l = 0; l < s.num_layers; ++l) {
    if (!s.moe(l)) continue;
    auto& L = w.layers[size_t(l)];
    std::copy_n(L.router.row(0), s.hidden, L.router.row(1));
    L.router_bias[0] = L.router_bias[1] = 10.0f;
  }
  const int32_t a = 7, q = 11;
  std::vector<int32_t> toks(8, a);
  toks.push_back(q);
  StepBatch b = prompt_batch(toks, 3);
  SelectionTrace own;
  StepOutput base = ref_backend(s, w, 3)->step(b, &own);
  ASSERT_EQ(own.layers, (std::vector<int>{0, 1}));
  ASSERT_EQ(own.blocks[0][8][0], (std::vector<int32_t>{0, 2}));
  ASSERT_EQ(own.experts[0][2], (std::vector<int32_t>{0, 1}));

  SelectionTrace offer = own;
  offer.blocks[0][8][0] = {1, 2};  // the other tied block: followed
  offer.blocks[0][8][1] = {0, 1};  // drops the local block: refused
  offer.experts[0][2] = {1, 0};    // the tied pair in the other order: followed
  offer.experts[1][3] = {0, 2};    // expert 2 for 1 (bias 10 apart): refused
  ref::FollowStats st;
  SelectionTrace used;
  StepOutput f = ref_backend(s, w, 3)->step_following(b, offer, {}, &st, &used);
  EXPECT_EQ(st.block_differ, 2);
  EXPECT_EQ(st.block_followed, 1);
  EXPECT_EQ(st.block_refused, 1);
  EXPECT_EQ(st.block_max_taken, 0.0);
  EXPECT_EQ(st.block_min_refused, INFINITY);
  EXPECT_EQ(st.expert_differ, 2);
  EXPECT_EQ(st.expert_followed, 1);
  EXPECT_EQ(st.expert_refused, 1);
  EXPECT_EQ(st.expert_max_taken, 0.0);
  EXPECT_GT(st.expert_min_refused, 1.0);
  EXPECT_FALSE(st.first_refused.empty());
  EXPECT_EQ(used.blocks[0][8][0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(used.blocks[0][8][1], (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(used.experts[0][2], (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(used.experts[1][3], (std::vector<int32_t>{0, 1}));
  // identical keys and values in blocks 0 and 1; the swapped expert order only reorders a sum
  EXPECT_CLOSE(f.logits, base.logits, 1e-5, 0.0);
}

TEST(RefFollow, FarChoicesRefusedUnlessTheToleranceIsOpened) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelSpec s = m3::test::small_spec();
  ModelWeights w = m3::test::make_random_weights(s, rng());
  const int T = 24, V = s.vocab_size;
  auto toks = m3::test::random_tokens(T, V, rng);
  StepBatch b = prompt_batch(toks, 8);
  SelectionTrace own;
  StepOutput base = ref_backend(s, w, 8)->step(b, &own);
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "blocks" : "experts");
    SelectionTrace offer = own;
    int t = 0;
    if (kind == 0) {
      // token 20 (block 5, 6 blocks > top 3): replace its lowest non-local block by an unselected one
      t = 20;
      auto& set = offer.blocks[0][size_t(t)][0];
      ASSERT_EQ(set.size(), 3u);
      int32_t out = set[0], in = -1;
      for (int32_t c = 0; c < 5 && in < 0; ++c)
        if (std::find(set.begin(), set.end(), c) == set.end()) in = c;
      set[0] = in;
      std::sort(set.begin(), set.end());
      (void)out;
    } else {
      t = 13;
      auto& list = offer.experts[0][size_t(t)];
      for (int32_t e = 0; e < s.num_experts; ++e)
        if (std::find(list.begin(), list.end(), e) == list.end()) {
          list.back() = e;
          break;
        }
    }
    ref::FollowStats refused, taken;
    SelectionTrace used;
    StepOutput r = ref_backend(s, w, 8)->step_following(b, offer, {}, &refused, &used);
    EXPECT_EQ(refused.refused(), 1);
    EXPECT_EQ(refused.followed(), 0);
    EXPECT_EQ(r.logits, base.logits) << "a refused choice leaves the reference as it was";
    EXPECT_EQ(used.blocks, own.blocks);
    EXPECT_EQ(used.experts, own.experts);
    const double g = kind == 0 ? refused.block_min_refused : refused.expert_min_refused;
    EXPECT_GT(g, ref::kTieRel);
    EXPECT_TRUE(std::isfinite(g));
    ref::FollowOptions open;
    open.block_tie_rel = open.expert_tie_rel = 1e300;
    StepOutput o = ref_backend(s, w, 8)->step_following(b, offer, open, &taken);
    // the choice is taken; the tokens after it then see another state, and every one of their own
    // choices that now differs from the offered (unchanged) trace is taken as well
    EXPECT_GE(taken.followed(), 1);
    EXPECT_EQ(taken.refused(), 0);
    EXPECT_GE(kind == 0 ? taken.block_max_taken : taken.expert_max_taken, g);
    for (int i = 0; i < T; ++i) {
      const bool same = std::equal(o.row(0, i), o.row(0, i) + V, base.row(0, i));
      if (i < t) {
        EXPECT_TRUE(same) << "row " << i << " precedes the followed choice";
      } else if (i == t) {
        EXPECT_FALSE(same) << "row " << i << " took another choice";
      }
    }
  }
}
