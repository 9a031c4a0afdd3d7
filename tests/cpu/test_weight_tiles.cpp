// The tiled FP8 layout (core/weight_tiles.h) and the prepared arena that uses it (model/prepare.h):
//  - tiled_offset is a bijection of [tiled_rows(rows)) x [ld) onto the stored bytes, matches the
//    formula of docs/formats.md, and tile / untile round-trip fresh random matrices with the
//    padding rows zero;
//  - an arena planned tiled and one planned row-major, filled from the same weights (a shape whose
//    widths are not multiples of 64 and whose row counts are not multiples of 16), hold the same
//    code at every (row, column) and zero in every padding byte, dequantize to identical weights,
//    and agree byte for byte on every other tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/prepared_tensors.h"
#include "core/weight_tiles.h"
#include "model/prepare.h"
#include "model/synthetic.h"

using namespace m3;

TEST(WeightTiles, OffsetIsABijectionAndRoundTrips) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t rows = 1 + rng() % 70, ld = 64 * (1 + rng() % 5);
    SCOPED_TRACE("rows " + std::to_string(rows) + " ld " + std::to_string(ld));
    const int64_t stored = tiled_rows(rows);
    ASSERT_EQ(stored % kTileRows, 0);
    ASSERT_GE(stored, rows);
    ASSERT_LT(stored - rows, kTileRows);
    std::vector<int> hits(size_t(stored * ld), 0);
    for (int64_t r = 0; r < stored; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        const int64_t o = tiled_offset(r, c, ld);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, stored * ld);
        // the formula of docs/formats.md, written out again
        ASSERT_EQ(o, (r / 16) * 16 * ld + (c / 64) * 1024 + (r % 16) * 64 + c % 64);
        ++hits[size_t(o)];
      }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "stored byte " << i;
    std::vector<uint8_t> m(size_t(rows * ld)), tiled(size_t(stored * ld), 0xa5), back(m.size(), 0x5a);
    for (auto& b : m) b = uint8_t(rng());
    tile_rows_to(m.data(), rows, ld, tiled.data());
    for (int64_t r = rows; r < stored; ++r)
      for (int64_t c = 0; c < ld; ++c) ASSERT_EQ(tiled[size_t(tiled_offset(r, c, ld))], 0) << "padding row " << r;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c) ASSERT_EQ(tiled[size_t(tiled_offset(r, c, ld))], m[size_t(r * ld + c)]);
    untile_rows_to(tiled.data(), rows, ld, back.data());
    ASSERT_EQ(back, m);
  }
}


TEST(WeightTiles, TiledArenaHoldsTheRowMajorCodes) {
  ModelSpec spec = synthetic_preset("tiny");
  spec.hidden = 200;  // O's rows and every K of q|k|v|iq|ik: not a multiple of 16 / 64
  spec.num_heads = 3;
  spec.num_kv_heads = 1;
  spec.head_dim = 40;  // fused rows 3*40 + 40 + 40 (+ 2*40 + 40 sparse): not multiples of 16
  spec.rotary_dim = 16;
  spec.index_heads = 1;
  spec.index_dim = 40;
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  const ModelWeights w = synthetic_weights(spec, so);
  PrepareOptions ot, orow;
  orow.fp8_tiled = false;
  const PreparedLayout Lt = plan_prepared(spec, ot), Lr = plan_prepared(spec, orow);
  ThreadPool pool(2);
  // tiled arena filled over poison through a window of a few tiles: every stored byte is written
  std::vector<uint8_t> at(Lt.total_bytes, 0xa5), ar(Lr.total_bytes, 0);
  HostArenaSink st(at, 1 << 13), sr(ar);
  fill_prepared(Lt, *make_weight_source(w), st, pool);
  fill_prepared(Lr, *make_weight_source(w), sr, pool);
  const auto tt = test::prepared_tensors(Lt), tr = test::prepared_tensors(Lr);
  ASSERT_EQ(tt.size(), tr.size());
  int tiled_seen = 0;
  for (size_t i = 0; i < tt.size(); ++i) {
    const PTensor &T = *tt[i], &R = *tr[i];
    if (!T.tiled) {  // every other tensor: the same bytes
      ASSERT_EQ(T.bytes, R.bytes);
      ASSERT_EQ(std::memcmp(at.data() + T.offset, ar.data() + R.offset, T.bytes), 0) << "tensor " << i;
      continue;
    }
    ++tiled_seen;
    ASSERT_EQ(T.dtype, DType::F8_E4M3);
    ASSERT_FALSE(R.tiled);
    ASSERT_EQ(T.row_bytes % kTileBlockBytes, 0);
    ASSERT_EQ(T.bytes, uint64_t(tiled_rows(T.rows) * T.row_bytes));
    std::vector<int> seen(T.bytes, 0);
    for (int64_t r = 0; r < T.rows; ++r)
      for (int64_t c = 0; c < T.cols; ++c) {
        const int64_t o = tiled_offset(r, c, T.row_bytes);
        seen[size_t(o)] = 1;
        ASSERT_EQ(at[T.offset + uint64_t(o)], ar[R.offset + uint64_t(r * R.row_bytes + c)])
            << "tensor " << i << " row " << r << " column " << c;
      }
    for (size_t o = 0; o < seen.size(); ++o)
      if (!seen[o]) ASSERT_EQ(at[T.offset + o], 0) << "tensor " << i << ": padding byte " << o << " not zero";
  }
  EXPECT_GE(tiled_seen, 2 * spec.num_layers);
  const ModelWeights dt = dequantize_prepared(Lt, host_arena_reader(at)), dr = dequantize_prepared(Lr, host_arena_reader(ar));
  for (int l = 0; l < spec.num_layers; ++l) {
    const LayerWeights &a = dt.layers[size_t(l)], &b = dr.layers[size_t(l)];
    for (auto [x, y, name] : {std::tuple{&a.wq, &b.wq, "wq"}, {&a.wk, &b.wk, "wk"}, {&a.wv, &b.wv, "wv"},
                              {&a.wo, &b.wo, "wo"}, {&a.wiq, &b.wiq, "wiq"}, {&a.wik, &b.wik, "wik"}}) {
      ASSERT_EQ(x->rows, y->rows) << name;
      ASSERT_EQ(x->data, y->data) << "layer " << l << " " << name;
    }
  }
}
