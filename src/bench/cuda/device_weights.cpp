// Random prepared weights and caches on the device (device_weights.h).
#include "bench/cuda/device_weights.h"

#include <algorithm>
#include <cmath>

#include "bench/cuda/probes.h"
#include "native/cuda_check.h"
#include "native/dev_buf.h"
#include "native/prepared.h"
#include "native/weight_tiles.h"

namespace m3::bench {

namespace {

int64_t used_bytes(const PTensor& t) {
  switch (t.dtype) {
    case DType::E2M1x2: return (t.cols + 1) / 2;
    default: return t.cols * int64_t(dtype_size(t.dtype));
  }
}

void fill_tensor(uint8_t* base, const PTensor& t, FillFormat f, float lo, float hi, uint64_t seed, cudaStream_t s) {
  if (t.empty()) return;
  if (t.tiled) {  // row-major into scratch, then tiled into place (padding rows and columns zero)
    native::DevBuf scratch(size_t(t.rows) * size_t(t.row_bytes));
    M3_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, scratch.bytes(), s));
    fill_random(scratch.get<uint8_t>(), t.rows, t.row_bytes, used_bytes(t), f, lo, hi, seed, s);
    native::tile_fp8(scratch.get<uint8_t>(), t.rows, t.row_bytes, base + t.offset, s);
    M3_CUDA_CHECK(cudaStreamSynchronize(s));  // before the scratch is freed
    return;
  }
  const int64_t rows = t.rows * t.slots, used = used_bytes(t);
  if (used == t.row_bytes)  // no padding: one flat row (cheaper indexing)
    fill_random(base + t.offset, 1, rows * used, rows * used, f, lo, hi, seed, s);
  else
    fill_random(base + t.offset, rows, t.row_bytes, used, f, lo, hi, seed, s);
}

}  // namespace

void fill_prepared_random(uint8_t* base, const PreparedLayout& L, uint64_t seed, cudaStream_t s) {
  uint64_t k = seed * 1000003;
  auto bf16 = [&](const PTensor& t, float a) { fill_tensor(base, t, FillFormat::Bf16, -a, a, ++k, s); };
  auto fp8 = [&](const PFp8& m) {
    fill_tensor(base, m.codes, FillFormat::Fp8, 0, 0, ++k, s);
    // |e4m3| up to 448 times scales ~1/(448 sqrt(K)): outputs of order one
    const float sc = 1.0f / (448.0f * std::sqrt(float(std::max<int64_t>(1, m.codes.cols))));
    if (m.mx()) {  // MXFP8: E8M0 block scales around the same magnitude (2^e / 2 .. 2^e * 2)
      const float e = std::round(std::log2(sc)) + 127.f;
      fill_tensor(base, m.scales, FillFormat::E8M0, e - 1, e + 1, ++k, s);
    } else {
      fill_tensor(base, m.scales, FillFormat::F32, 0.5f * sc, 1.5f * sc, ++k, s);
    }
  };
  auto mx = [&](const PMxfp4& m) {
    if (m.fp8()) {  // MXFP8: |e4m3| up to 448 (E2M1's 6 times 2^6), so scales 2^6 smaller
      fill_tensor(base, m.codes, FillFormat::Fp8, 0, 0, ++k, s);
      fill_tensor(base, m.scales, FillFormat::E8M0, 112, 115, ++k, s);  // 2^-15 .. 2^-12
      return;
    }
    fill_tensor(base, m.codes, FillFormat::Bytes, 0, 0, ++k, s);
    fill_tensor(base, m.scales, FillFormat::E8M0, 118, 121, ++k, s);  // 2^-9 .. 2^-6
  };
  bf16(L.embed, 1.0f);
  bf16(L.lm_head, 0.02f);
  bf16(L.final_norm, 0.2f);
  for (const auto& Y : L.layers) {
    for (const PTensor* t : {&Y.input_norm, &Y.post_norm, &Y.q_norm, &Y.k_norm, &Y.iq_norm, &Y.ik_norm}) bf16(*t, 0.2f);
    fp8(Y.qkv);
    fp8(Y.o);
    bf16(Y.dense_gate_up, 0.02f);
    bf16(Y.dense_down, 0.02f);
    if (Y.router.dtype == DType::BF16) bf16(Y.router, 0.05f);
    else fill_tensor(base, Y.router, FillFormat::F32, -0.05f, 0.05f, ++k, s);
    fill_tensor(base, Y.router_bias, FillFormat::F32, -0.05f, 0.05f, ++k, s);
    mx(Y.w13);
    mx(Y.w2);
    mx(Y.shared_w13);
    mx(Y.shared_w2);
  }
}

void fill_cache_random(native::DeviceKvCache& cache, uint64_t seed, cudaStream_t s) {
  const auto& sh = cache.shape();
  const FillFormat kvf = sh.kv_dtype == DType::BF16 ? FillFormat::Bf16 : FillFormat::Fp8;
  const FillFormat ikf = sh.ik_dtype == DType::BF16 ? FillFormat::Bf16 : FillFormat::Fp8;
  for (int l = 0; l < sh.num_layers; ++l) {
    native::KvLayerView v = cache.layer(l);
    const int64_t kvb = int64_t(sh.kv_bytes());
    fill_random(v.k, 1, kvb, kvb, kvf, -1, 1, seed * 7919 + uint64_t(3 * l), s);
    fill_random(v.v, 1, kvb, kvb, kvf, -1, 1, seed * 7919 + uint64_t(3 * l + 1), s);
    if (v.ik) {
      const int64_t ikb = int64_t(sh.ik_bytes());
      fill_random(v.ik, 1, ikb, ikb, ikf, -1, 1, seed * 7919 + uint64_t(3 * l + 2), s);
    }
  }
}

DeviceArena::DeviceArena(const PreparedLayout& layout, uint64_t seed, cudaStream_t s)
    : w_(native::PreparedWeights::create_on_device(
          layout, [&](uint8_t* base, cudaStream_t st) { fill_prepared_random(base, layout, seed, st); }, s)),
      base_(const_cast<uint8_t*>(w_->device_base())) {}
DeviceArena::~DeviceArena() = default;

native::Fp8Weight DeviceArena::qkv(int l) const { return native::arena_fp8_view(base_, layout().layers.at(size_t(l)).qkv); }
native::Fp8Weight DeviceArena::o(int l) const { return native::arena_fp8_view(base_, layout().layers.at(size_t(l)).o); }
native::MoeWeights DeviceArena::moe(int l) const { return native::arena_moe_view(base_, layout(), l); }

}  // namespace m3::bench
