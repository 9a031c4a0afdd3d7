// The prepared weight store's host side (model/prepare.h): arena layout (alignment, no overlap,
// real-model row counts), filling from host weights and from a checkpoint on disk (identical
// bytes), dequantizing back (exactly the quantizers' numbers, tensors in the right places, gate/up
// de-interleaved, the shared expert in its slot or its own tensors), tensor-parallel shards, and
// errors that name the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include "common/prepared_tensors.h"
#include "core/codecs.h"
#include "model/prepare.h"
#include "model/prepared_tensors.h"
#include "model/tp_shard.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight_table.h"

using namespace m3;

namespace {

std::vector<const PTensor*> all_tensors(const PreparedLayout& L) { return test::prepared_tensors(L); }

void expect_same(const Mat& got, const Mat& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  for (size_t i = 0; i < want.data.size(); ++i)
    ASSERT_EQ(got.data[i], want.data[i]) << what << " element " << i << " (row " << i / size_t(want.cols) << ")";
}
void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " element " << i;
}

Mat slice(const Mat& m, int r0, int nr, int c0, int nc) {
  Mat o(nr, nc);
  for (int r = 0; r < nr; ++r)
    for (int c = 0; c < nc; ++c) o.row(r)[c] = m.row(r0 + r)[c0 + c];
  return o;
}
Mat bf16_round(const Mat& m) {
  Mat o = m;
  for (auto& v : o.data) v = bf16_to_f32(f32_to_bf16(v));
  return o;
}
Vec bf16_round(const Vec& v) {
  Vec o = v;
  for (auto& x : o) x = bf16_to_f32(f32_to_bf16(x));
  return o;
}
Mat fp8_round(const Mat& m) { return dequantize(quantize_fp8(m)); }
Mat mx_round(const Mat& m) { return dequantize(quantize_mxfp4(m)); }

// Every tensor of rank `rank` of `tp`, dequantized, equals the quantizer applied to the matching
// slice of the source weights.
void check_rank(const ModelSpec& spec, const ModelWeights& src, int rank, int tp, bool router_bf16) {
  SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(tp));
  PrepareOptions opt;
  opt.tp_rank = rank;
  opt.tp_size = tp;
  opt.router_bf16 = router_bf16;
  PreparedLayout L = plan_prepared(spec, opt);
  // filled twice over different poison: every byte of every tensor must be written (no byte may
  // keep its poison), and the result must not depend on the thread count
  std::vector<uint8_t> arena(L.total_bytes, 0xA5), other(L.total_bytes, 0x5A);
  HostArenaSink sink(arena, 1 << 16), sink2(other);  // a small window: many chunks
  ThreadPool pool(2), pool1(1);
  uint64_t last = 0, calls = 0;
  fill_prepared(L, *make_weight_source(src), sink, pool, [&](uint64_t d, uint64_t t) {
    EXPECT_GE(d, last);
    EXPECT_LE(d, t);
    last = d;
    ++calls;
  });
  EXPECT_GT(calls, 1u);
  fill_prepared(L, *make_weight_source(src), sink2, pool1);
  for (const PTensor* t : all_tensors(L))
    for (uint64_t i = t->offset; i < t->offset + t->bytes; ++i)
      ASSERT_EQ(arena[i], other[i]) << "arena byte " << i << " of a tensor at " << t->offset << " not written";
  ModelWeights d = dequantize_prepared(L, host_arena_reader(arena));
  const int H = spec.hidden;
  const int V = spec.vocab_size / tp;
  expect_same(d.embed, bf16_round(src.embed), "embed");
  expect_same(d.lm_head, bf16_round(slice(src.lm_head, rank * V, V, 0, H)), "lm_head");
  expect_same(d.final_norm, bf16_round(src.final_norm), "final_norm");
  for (int l = 0; l < spec.num_layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& s = src.layers[size_t(l)];
    const LayerWeights& g = d.layers[size_t(l)];
    expect_same(g.input_norm, bf16_round(s.input_norm), "input_norm");
    expect_same(g.post_norm, bf16_round(s.post_norm), "post_norm");
    expect_same(g.q_norm, bf16_round(s.q_norm), "q_norm");
    expect_same(g.k_norm, bf16_round(s.k_norm), "k_norm");
    // K/V (and index) heads split, or replicated past their count (model/tp_shard.h)
    const ModelSpec rs = tp_rank_spec(spec, tp);
    const int qr = spec.q_dim() / tp, kr = rs.kv_dim(), kv0 = tp_rank_kv_head(spec, rank, tp);
    // row-scaled FP8: slicing rows commutes with quantizing
    expect_same(g.wq, fp8_round(slice(s.wq, rank * qr, qr, 0, H)), "wq");
    expect_same(g.wk, fp8_round(slice(s.wk, kv0 * spec.head_dim, kr, 0, H)), "wk");
    expect_same(g.wv, fp8_round(slice(s.wv, kv0 * spec.head_dim, kr, 0, H)), "wv");
    expect_same(g.wo, fp8_round(slice(s.wo, 0, H, rank * qr, qr)), "wo");
    if (spec.sparse(l)) {
      const int iqr = rs.index_heads * spec.index_dim;
      expect_same(g.wiq, fp8_round(slice(s.wiq, kv0 * spec.index_dim, iqr, 0, H)), "wiq");
      expect_same(g.wik, fp8_round(s.wik), "wik");
      expect_same(g.iq_norm, bf16_round(s.iq_norm), "iq_norm");
      expect_same(g.ik_norm, bf16_round(s.ik_norm), "ik_norm");
    } else {
      EXPECT_TRUE(g.wiq.empty());
    }
    if (!spec.moe(l)) {
      const int I = spec.dense_inter / tp;
      expect_same(g.dense.gate, bf16_round(slice(s.dense.gate, rank * I, I, 0, H)), "dense gate");
      expect_same(g.dense.up, bf16_round(slice(s.dense.up, rank * I, I, 0, H)), "dense up");
      expect_same(g.dense.down, bf16_round(slice(s.dense.down, 0, H, rank * I, I)), "dense down");
      continue;
    }
    expect_same(g.router, router_bf16 ? bf16_round(s.router) : s.router, "router");
    expect_same(g.router_bias, s.router_bias, "router_bias");
    const int I = spec.moe_inter / tp;
    ASSERT_EQ(g.experts.size(), size_t(spec.num_experts));
    for (int e = 0; e < spec.num_experts; ++e) {
      const MlpWeights& se = s.experts[size_t(e)];
      expect_same(g.experts[size_t(e)].gate, mx_round(slice(se.gate, rank * I, I, 0, H)), "expert gate " + std::to_string(e));
      expect_same(g.experts[size_t(e)].up, mx_round(slice(se.up, rank * I, I, 0, H)), "expert up " + std::to_string(e));
      expect_same(g.experts[size_t(e)].down, mx_round(slice(se.down, 0, H, rank * I, I)), "expert down " + std::to_string(e));
    }
    if (spec.shared_inter > 0) {
      const int S = spec.shared_inter / tp;
      expect_same(g.shared.gate, mx_round(slice(s.shared.gate, rank * S, S, 0, H)), "shared gate");
      expect_same(g.shared.up, mx_round(slice(s.shared.up, rank * S, S, 0, H)), "shared up");
      expect_same(g.shared.down, mx_round(slice(s.shared.down, 0, H, rank * S, S)), "shared down");
    }
  }
}

}  // namespace

TEST(Prepared, LayoutAlignedAndDisjoint) {
  for (const char* preset : {"tiny", "real-heads", "real"}) {
    ModelSpec spec = synthetic_preset(preset);
    for (int tp : {1, 2, 4}) {
      if (spec.num_kv_heads % tp) continue;
      SCOPED_TRACE(std::string(preset) + " tp " + std::to_string(tp));
      PrepareOptions opt;
      opt.tp_size = tp;
      opt.tp_rank = tp - 1;
      PreparedLayout L = plan_prepared(spec, opt);
      auto ts = all_tensors(L);
      std::sort(ts.begin(), ts.end(), [](auto a, auto b) { return a->offset < b->offset; });
      uint64_t end = 0, sum = 0, fam = 0;
      for (const PTensor* t : ts) {
        EXPECT_EQ(t->offset % kArenaAlign, 0u);
        EXPECT_GE(t->offset, end);
        EXPECT_EQ(t->bytes, uint64_t(t->slots) * uint64_t(t->tiled ? tiled_rows(t->rows) : t->rows) *
                                uint64_t(t->row_bytes));
        // FP8 projection codes: whole 16-row tiles of 64-byte blocks (core/weight_tiles.h)
        EXPECT_EQ(t->tiled, t->dtype == DType::F8_E4M3);
        if (t->tiled) EXPECT_EQ(t->row_bytes % kTileBlockBytes, 0);
        // code rows are read with 16-byte loads; scale rows (fp32 per row, E8M0 per block) are not padded
        if (t->dtype != DType::E8M0 && (t->dtype != DType::F32 || t->cols > 1)) {
          EXPECT_EQ(t->row_bytes % 16, 0);
        }
        end = t->offset + t->bytes;
        sum += t->bytes;
      }
      EXPECT_LE(end, L.total_bytes);
      for (uint64_t b : L.family_bytes) fam += b;
      EXPECT_EQ(fam, sum);
      EXPECT_LT(L.total_bytes - sum, ts.size() * kArenaAlign);
    }
  }
  // the released model: fused rows 64*128 + 2*4*128 + 4*128 + 128 = 9856 (2560 per rank at TP 4)
  ModelSpec real = synthetic_preset("real");
  PreparedLayout L1 = plan_prepared(real);
  EXPECT_EQ(L1.layers[3].qkv.codes.rows, 9856);
  EXPECT_EQ(L1.layers[0].qkv.codes.rows, 64 * 128 + 2 * 4 * 128);
  EXPECT_EQ(L1.layers[3].expert_slots, 129);
  EXPECT_TRUE(L1.layers[3].shared_in_slot);
  EXPECT_EQ(L1.layers[3].w13.codes.row_bytes, 3072);
  EXPECT_EQ(L1.layers[3].w2.scales.row_bytes, 96);
  PrepareOptions o4;
  o4.tp_size = 4;
  PreparedLayout L4 = plan_prepared(real, o4);
  EXPECT_EQ(L4.layers[3].qkv.codes.rows, 2560);
  EXPECT_EQ(L4.layers[3].o.codes.cols, 2048);
  EXPECT_EQ(L4.layers[3].w13.codes.rows, 2 * 768);
  EXPECT_EQ(L4.layers[3].w2.codes.row_bytes, 384);
  // per-rank bytes: the experts dominate (57 layers x 129 slots x 3 x 768 x 6144 x 4.25 bits)
  double experts = double(L4.family_bytes[size_t(PreparedFamily::Experts)] +
                          L4.family_bytes[size_t(PreparedFamily::SharedExpert)]);
  EXPECT_NEAR(experts, 57.0 * 129 * 3 * 768 * 6144 * 4.25 / 8, 1e6);
  std::string d = L4.describe_bytes();
  EXPECT_NE(d.find("routed experts mxfp4"), std::string::npos) << d;
}

TEST(Prepared, RoundTripTinyAllRanks) {
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  ModelWeights w = synthetic_weights(spec, so);
  check_rank(spec, w, 0, 1, false);
  check_rank(spec, w, 1, 2, true);
}

// Past the KV heads (tp 4 over tiny's 2 KV and index heads) each rank's arena holds the heads its
// query heads use, replicated; expert widths that would cut an MXFP4 block of 32 between two
// ranks are refused, naming the field.
TEST(Prepared, ReplicatedKvHeadsAndWholeMxfp4Blocks) {
  ModelSpec spec = synthetic_preset("tiny");
  spec.moe_inter = spec.shared_inter = 128;  // 32 columns per rank at tp 4
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  ModelWeights w = synthetic_weights(spec, so);
  for (int rank = 0; rank < 4; ++rank) check_rank(spec, w, rank, 4, false);
  PrepareOptions o;
  o.tp_size = 4;
  EXPECT_EQ(plan_prepared(spec, o).kv_heads, 1);
  o.tp_rank = 3;
  EXPECT_EQ(plan_prepared(spec, o).kv_head0, 1);
  const ModelSpec tiny = synthetic_preset("tiny");  // 64 / 4 = 16 columns: half a block
  try {
    plan_prepared(tiny, o);
    ADD_FAILURE() << "16 expert columns per rank were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size = 64 over 4 ranks gives 16 columns"), std::string::npos)
        << e.what();
  }
}

TEST(Prepared, SharedExpertOfItsOwnWidth) {
  ModelSpec spec = synthetic_preset("tiny");
  spec.shared_inter = 2 * spec.moe_inter;
  spec.num_layers = 2;
  spec.attn.resize(2);
  spec.mlp.resize(2);
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  ModelWeights w = synthetic_weights(spec, so);
  PreparedLayout L = plan_prepared(spec);
  for (const auto& Y : L.layers)
    if (Y.moe) {
      EXPECT_FALSE(Y.shared_in_slot);
      EXPECT_EQ(Y.expert_slots, spec.num_experts);
      EXPECT_EQ(Y.shared_w13.codes.rows, 2 * spec.shared_inter);
    }
  check_rank(spec, w, 0, 1, false);
  check_rank(spec, w, 1, 2, false);
}

TEST(Prepared, CheckpointSourceMatchesHostSource) {
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions so;
  so.seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(so.seed));
  auto dir = std::filesystem::temp_directory_path() / ("m3_prepared_" + std::to_string(so.seed));
  write_synthetic_checkpoint(dir, spec, so);
  SafetensorsSet files = SafetensorsSet::open(dir);
  WeightTable table = build_weight_table(spec, detect_text_prefix(files));
  WeightBinding bind = bind_weights(table, files);
  PreparedLayout L = plan_prepared(spec);
  ThreadPool pool(2);
  std::vector<uint8_t> a(L.total_bytes, 0), b(L.total_bytes, 0);
  HostArenaSink sa(a), sb(b);
  fill_prepared(L, *make_weight_source(bind), sa, pool);
  ModelWeights w = synthetic_weights(spec, so);
  fill_prepared(L, *make_weight_source(w), sb, pool);
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << "bytes differ between the checkpoint and the in-memory weights";
  std::filesystem::remove_all(dir);
}

TEST(Prepared, ErrorsNameTheTensor) {
  ModelSpec spec = synthetic_preset("tiny");
  PrepareOptions opt;
  opt.tp_size = 3;
  try {
    plan_prepared(spec, opt);
    ADD_FAILURE() << "tp 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
  ModelWeights w = synthetic_weights(spec);
  w.layers[2].experts[5].up.row(7)[3] = NAN;
  PreparedLayout L = plan_prepared(spec);
  std::vector<uint8_t> arena(L.total_bytes);
  HostArenaSink sink(arena);
  ThreadPool pool(2);
  try {
    fill_prepared(L, *make_weight_source(w), sink, pool);
    ADD_FAILURE() << "NaN weight accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layer 2 experts w13"), std::string::npos) << m;
    EXPECT_NE(m.find("expert_up expert 5 row 7"), std::string::npos) << m;
    EXPECT_NE(m.find("column 3"), std::string::npos) << m;
  }
}

// The arena as named tensors (model/prepared_tensors.h, what a framework lends the library level):
// every stored tensor appears once, with its offset and bytes, and its shape times its element
// size is its bytes; names are unique within a layer; check_borrowed accepts exactly the layout
// (compact strides, aligned, the stored type or the unsigned word of its width, the device asked)
// and names the tensor in every refusal.
TEST(Prepared, NamedTensorsCoverTheArena) {
  for (const char* preset : {"tiny", "real"}) {
    const ModelSpec spec = synthetic_preset(preset);
    for (int tp : {1, 4}) {
      if (spec.num_kv_heads % tp) continue;
      SCOPED_TRACE(std::string(preset) + " tp " + std::to_string(tp));
      PrepareOptions opt;
      opt.tp_size = tp;
      const PreparedLayout L = plan_prepared(spec, opt);
      std::vector<std::pair<uint64_t, uint64_t>> named;
      auto take = [&](const std::vector<TensorSpec>& v) {
        std::vector<std::string> names;
        for (const TensorSpec& t : v) {
          int64_t n = t.elem_bytes;
          for (int64_t d : t.shape) n *= d;
          EXPECT_EQ(uint64_t(n), t.bytes) << t.describe();
          named.emplace_back(t.offset, t.bytes);
          names.push_back(t.name);
        }
        std::sort(names.begin(), names.end());
        EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
      };
      take(model_tensor_specs(L));
      for (int l = 0; l < int(L.layers.size()); ++l) take(layer_tensor_specs(L, l));
      std::vector<std::pair<uint64_t, uint64_t>> stored;
      for (const PTensor* t : test::prepared_tensors(L)) stored.emplace_back(t->offset, t->bytes);
      std::sort(named.begin(), named.end());
      std::sort(stored.begin(), stored.end());
      EXPECT_EQ(named, stored);
    }
  }
  const PreparedLayout L = plan_prepared(synthetic_preset("tiny"), {});
  const TensorSpec s = layer_tensor_specs(L, 1)[6];  // qkv.codes
  ASSERT_EQ(s.name, "qkv.codes");
  alignas(16) static uint8_t buf[32];
  BorrowedTensor good{buf, ElemKind::UInt, 8, s.shape, {}, true, -1};
  EXPECT_EQ(check_borrowed(s, good, true), "");
  BorrowedTensor f8 = good;
  f8.kind = ElemKind::Float8E4M3;
  EXPECT_EQ(check_borrowed(s, f8, true), "");
  BorrowedTensor compact = good;
  compact.strides = {s.shape[1], 1};
  EXPECT_EQ(check_borrowed(s, compact, true), "");
  auto refuses = [&](BorrowedTensor t, bool cpu, const char* what) {
    const std::string why = check_borrowed(s, t, cpu);
    EXPECT_NE(why.find("qkv.codes"), std::string::npos) << what << ": " << why;
    EXPECT_NE(why.find(what), std::string::npos) << why;
  };
  BorrowedTensor t = good;
  t.kind = ElemKind::Int;
  refuses(t, true, "element type");
  t = good;
  t.bits = 16;
  refuses(t, true, "element type");
  t = good;
  t.shape[0] += 16;
  refuses(t, true, "shape");
  t = good;
  t.strides = {1, s.shape[0]};
  refuses(t, true, "strides");
  t = good;
  t.data = buf + 1;
  refuses(t, true, "aligned");
  refuses(good, false, "device buffer");
  t = good;
  t.on_cpu = false;
  refuses(t, true, "host memory");
  t = good;
  t.data = nullptr;
  refuses(t, true, "no data");
}
