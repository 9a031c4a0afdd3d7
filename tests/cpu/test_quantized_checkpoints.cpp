// The released quantized layouts (issue 17): MXFP8 (official), MXFP4 (AMD Quark) and
// MXFP4-AttnFP8, read as their quantization_config declares them.
//   - Each format, written by make-tiny's writer with a fresh seed, and its BF16 twin written by an
//     independent Python writer (tests/py/quant_twin.py: its own E4M3 / E2M1 / E8M0 decoding) load
//     to bitwise the same fp32 weights and give bitwise the same CPU-reference logits and greedy
//     ids; the quantization is real (some values differ from the unquantized generator's).
//   - Malformed files and configs fail with messages that name the tensor, the scale, the block
//     and the config rule.
//   - MXFP4 experts enter the prepared arena as their bytes (a block no quantizer would write
//     survives), gate/up rows interleaved.
//   - quantization_config parsing: patterns, rules, refusals.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/process.h"
#include "common/temp_dir.h"
#include "core/check.h"
#include "core/parallel.h"
#include "model/load_weights.h"
#include "model/prepare.h"
#include "model/quant_config.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight_table.h"
#include "ref/engine.h"
#include "ref/greedy_run.h"

using namespace m3;
using json = nlohmann::json;
namespace fs = std::filesystem;
using m3::test::TempDir;

namespace {

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

size_t numel(const WeightEntry& e) {
  size_t n = 1;
  for (auto d : e.shape) n *= size_t(d);
  return n;
}

// Every tensor bitwise equal.
void expect_same_weights(const ModelSpec& spec, ModelWeights& a, ModelWeights& b, const std::string& what) {
  for (const auto& e : build_weight_table(spec).entries) {
    const float* pa = host_destination(a, e);
    const float* pb = host_destination(b, e);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < numel(e); ++i)
      if (std::memcmp(pa + i, pb + i, 4) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": " << e.describe() << ": " << bad << " values differ, first at [" << first
                       << "]: " << pa[first] << " vs " << pb[first];
  }
}

// The error message of f(), or "" when it does not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string twin_script() { return std::string(M3_SOURCE_DIR) + "/tests/py/quant_twin.py"; }

// Rewrites dir's single model.safetensors through edit(name, dtype, shape, bytes) -> keep?
template <class Edit>
void rewrite_checkpoint(const fs::path& dir, Edit edit) {
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>, std::vector<uint8_t>>> all;
  {
    SafetensorsSet set = SafetensorsSet::open(dir);
    for (const auto& n : set.names()) {
      const TensorView& t = set.get(n);
      all.emplace_back(n, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
  }
  SafetensorsWriter w;
  for (auto& [name, dt, shape, bytes] : all)
    if (edit(name, dt, shape, bytes)) w.add(name, dt, shape, bytes);
  w.write(dir / "model.safetensors");
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}
void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p, std::ios::trunc);
  f << j.dump(2);
}

const char* kPrefix = "language_model.model.layers.";

// A fresh make-tiny checkpoint of `format` in dir (seed drawn fresh, recorded in opt).
void write_tiny(const fs::path& dir, SyntheticFormat format, SyntheticOptions& opt) {
  opt.seed = fresh_seed();
  opt.format = format;
  write_synthetic_checkpoint(dir, synthetic_preset("tiny"), opt);
}

// The prepared arena of the checkpoint in dir (fill_prepared through the checkpoint's own source);
// throws what filling throws.
std::vector<uint8_t> fill_arena(const ModelSpec& spec, const fs::path& dir, const PreparedLayout& L,
                                uint8_t poison = 0x5a) {
  SafetensorsSet files = SafetensorsSet::open(dir);
  WeightBinding bind = bind_weights(build_checkpoint_table(spec, files, dir), files);
  std::vector<uint8_t> arena(L.total_bytes, poison);
  HostArenaSink sink(arena);
  ThreadPool pool(2);
  fill_prepared(L, *make_weight_source(bind), sink, pool);
  return arena;
}

}  // namespace

class QuantizedFormat : public ::testing::TestWithParam<SyntheticFormat> {};

TEST_P(QuantizedFormat, EqualsItsBf16TwinWrittenIndependently) {
  const SyntheticFormat fmt = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("format " + std::string(synthetic_format_name(fmt)) + ", seed " + std::to_string(seed));
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  opt.seed = seed;
  opt.format = fmt;
  TempDir d;
  const fs::path q = d.path / "q", twin = d.path / "twin";
  write_synthetic_checkpoint(q, spec, opt);

  // the files hold the release's layout
  {
    SafetensorsSet set = SafetensorsSet::open(q);
    const std::string L1 = std::string(kPrefix) + "1.";
    const TensorView& w1 = set.get(L1 + "block_sparse_moe.experts.3.w1.weight");
    const TensorView& wq = set.get(L1 + "self_attn.q_proj.weight");
    const TensorView& router = set.get(L1 + "block_sparse_moe.gate.weight");
    EXPECT_EQ(router.dtype, DType::F32);
    EXPECT_EQ(set.get("language_model.lm_head.weight").dtype, DType::BF16);
    switch (fmt) {
      case SyntheticFormat::Mxfp8:
        EXPECT_EQ(w1.dtype, DType::F8_E4M3);
        EXPECT_EQ(wq.dtype, DType::F8_E4M3);
        EXPECT_EQ(set.get(L1 + "self_attn.q_proj.weight_scale_inv").dtype, DType::U8);
        EXPECT_EQ(set.get(std::string(kPrefix) + "0.mlp.down_proj.weight").dtype, DType::F8_E4M3);
        break;
      case SyntheticFormat::Mxfp4:
        EXPECT_EQ(w1.dtype, DType::U8);
        EXPECT_EQ(w1.shape[1], spec.hidden / 2);
        EXPECT_EQ(wq.dtype, DType::BF16);
        EXPECT_EQ(set.get(std::string(kPrefix) + "0.mlp.down_proj.weight").dtype, DType::BF16);
        break;
      case SyntheticFormat::Mxfp4AttnFp8:
        EXPECT_EQ(w1.dtype, DType::U8);
        EXPECT_EQ(wq.dtype, DType::F8_E4M3);
        EXPECT_EQ(set.get(L1 + "self_attn.q_proj.weight_scale").dtype, DType::F32);
        EXPECT_EQ(set.get(L1 + "self_attn.q_proj.input_scale").dtype, DType::F32);
        break;
      case SyntheticFormat::Bf16: break;
    }
  }

  const auto r = m3::test::run_shell("python3 " + twin_script() + " " + q.string() + " " + twin.string());
  ASSERT_EQ(r.rc, 0) << r.out;

  ModelWeights wq_ = load_model_weights(q, spec);
  ModelWeights wt = load_model_weights(twin, spec);
  expect_same_weights(spec, wq_, wt, "quantized vs its BF16 twin");
  ModelWeights gen = synthetic_weights(spec, opt);
  expect_same_weights(spec, wq_, gen, "quantized vs the generator's dequantized values");

  // the quantization is real: values differ from the unquantized generator's
  SyntheticOptions plain = opt;
  plain.format = SyntheticFormat::Bf16;
  ModelWeights raw = synthetic_weights(spec, plain);
  size_t differ = 0, total = 0;
  for (size_t i = 0; i < wq_.layers[1].experts[0].gate.data.size(); ++i, ++total)
    differ += wq_.layers[1].experts[0].gate.data[i] != raw.layers[1].experts[0].gate.data[i];
  EXPECT_GT(differ, total / 4) << "expert weights look unquantized";

  // the reference on both: bitwise the same logits and ids
  std::mt19937 rng{uint32_t(seed)};
  std::vector<int32_t> prompt(7);
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(spec.vocab_size));
  ref::GreedyOptions go;
  go.keep_logits = true;
  auto a = ref::make_ref_backend(spec, std::move(wq_), ref::RefOptions(16, 2));
  auto b = ref::make_ref_backend(spec, std::move(wt), ref::RefOptions(16, 2));
  ref::GreedyRun ra = ref::greedy_run(*a, prompt, 5, go), rb = ref::greedy_run(*b, prompt, 5, go);
  EXPECT_EQ(ra.tokens, rb.tokens);
  ASSERT_EQ(ra.logits.size(), rb.logits.size());
  for (size_t s = 0; s < ra.logits.size(); ++s) {
    ASSERT_EQ(ra.logits[s].size(), size_t(spec.vocab_size));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ra.logits[s].size(); ++i)
      if (std::memcmp(&ra.logits[s][i], &rb.logits[s][i], 4) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << "step " << s << ": " << bad << " logits differ, first at " << first << ": "
                       << ra.logits[s][first] << " vs " << rb.logits[s][first];
  }
}

INSTANTIATE_TEST_SUITE_P(Releases, QuantizedFormat,
                         ::testing::Values(SyntheticFormat::Mxfp8, SyntheticFormat::Mxfp4,
                                           SyntheticFormat::Mxfp4AttnFp8),
                         [](const auto& info) {
                           std::string n(synthetic_format_name(info.param));
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(QuantizedCheckpoint, MalformedFilesNameTheTensorAndTheRule) {
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  opt.seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(opt.seed));
  TempDir d;
  const std::string w1 = std::string(kPrefix) + "2.block_sparse_moe.experts.5.w1";
  auto fresh = [&](SyntheticFormat f, const std::string& name) {
    opt.format = f;
    fs::path p = d.path / name;
    write_synthetic_checkpoint(p, spec, opt);
    return p;
  };
  auto load_error = [&](const fs::path& p) { return error_of([&] { load_model_weights(p, spec); }); };
  auto has = [](const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; };

  {  // a missing scale
    fs::path p = fresh(SyntheticFormat::Mxfp4, "noscale");
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>&, std::vector<uint8_t>&) {
      return n != w1 + ".weight_scale";
    });
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, w1 + ".weight'") && has(m, "weight_scale") && has(m, "missing")) << m;
  }
  {  // a scale of the wrong shape
    fs::path p = fresh(SyntheticFormat::Mxfp8, "badshape");
    const std::string wq = std::string(kPrefix) + "1.self_attn.q_proj";
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == wq + ".weight_scale_inv") {
        shape[1] -= 1;
        b.resize(size_t(shape[0] * shape[1]));
      }
      return true;
    });
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, wq + ".weight_scale_inv") && has(m, "shape")) << m;
  }
  {  // E8M0 255 (NaN) in one block: named with its row and block
    fs::path p = fresh(SyntheticFormat::Mxfp4, "nanscale");
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == w1 + ".weight_scale") b[size_t(3 * shape[1] + 1)] = 0xff;  // row 3, block 1
      return true;
    });
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, w1 + ".weight_scale") && has(m, "255") && has(m, "row 3, block 1")) << m;
    // and the prepared arena refuses it the same way
    const std::string m2 = error_of([&] { fill_arena(spec, p, plan_prepared(spec)); });
    EXPECT_TRUE(has(m2, "255") && has(m2, "row 3, block 1") && has(m2, w1)) << m2;
  }
  {  // a block scale the CPU reference reads exactly but the GPU expert kernels cannot hold (2^2)
    fs::path p = fresh(SyntheticFormat::Mxfp4, "bigscale");
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == w1 + ".weight_scale") b[size_t(2 * shape[1] + 3)] = 129;  // row 2, block 3
      return true;
    });
    EXPECT_EQ(load_error(p), "");  // the reference: exact
    const std::string m = error_of([&] { fill_arena(spec, p, plan_prepared(spec)); });
    EXPECT_TRUE(has(m, "E8M0 129 (2^2)") && has(m, "row 2, block 3") && has(m, w1) && has(m, "up to 2^1")) << m;
  }
  {  // an E4M3 NaN code, and a per-tensor scale of 0, in the FP8 attention of the AttnFP8 layout
    const std::string wq = std::string(kPrefix) + "1.self_attn.q_proj";
    fs::path p = fresh(SyntheticFormat::Mxfp4AttnFp8, "nancode");
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == wq + ".weight") b[size_t(5 * shape[1] + 7)] = 0xff;  // row 5, column 7
      return true;
    });
    std::string m = load_error(p);
    EXPECT_TRUE(has(m, wq + ".weight'") && has(m, "NaN code 0xff") && has(m, "row 5, column 7")) << m;
    p = fresh(SyntheticFormat::Mxfp4AttnFp8, "zeroscale");
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>&, std::vector<uint8_t>& b) {
      if (n == wq + ".weight_scale") std::memset(b.data(), 0, 4);
      return true;
    });
    m = load_error(p);
    EXPECT_TRUE(has(m, wq + ".weight_scale'") && has(m, "not a finite positive number")) << m;
  }
  {  // the config excludes a tensor the files quantize
    fs::path p = fresh(SyntheticFormat::Mxfp4, "excluded");
    json cfg = read_json(p / "config.json");
    cfg["quantization_config"]["exclude"].push_back("*experts.5.w1");
    write_json(p / "config.json", cfg);
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, "experts.5.w1.weight'") && has(m, "U8") && has(m, "excluded by '*experts.5.w1'")) << m;
  }
  {  // the config quantizes a tensor the files hold in BF16
    fs::path p = fresh(SyntheticFormat::Mxfp4, "notquantized");
    json cfg = read_json(p / "config.json");
    auto& ex = cfg["quantization_config"]["exclude"];
    for (size_t i = 0; i < ex.size(); ++i)
      if (ex[i] == "*self_attn*") ex.erase(i);
    write_json(p / "config.json", cfg);
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, "self_attn") && has(m, "BF16") && has(m, "mxfp4") && has(m, "global_quant_config")) << m;
  }
  {  // a quantized layout with no quantization_config at all: MXFP4 is not guessed
    fs::path p = fresh(SyntheticFormat::Mxfp4, "noconfig");
    json cfg = read_json(p / "config.json");
    cfg.erase("quantization_config");
    write_json(p / "config.json", cfg);
    const std::string m = load_error(p);
    EXPECT_TRUE(has(m, "U8") && has(m, "no quantization_config")) << m;
  }
}

TEST(QuantizedCheckpoint, Mxfp4ExpertsEnterTheArenaAsStored) {
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  TempDir d;
  write_tiny(d.path, SyntheticFormat::Mxfp4, opt);
  SCOPED_TRACE("seed " + std::to_string(opt.seed));
  // a block no quantizer writes: all-zero codes under scale 128 (a quantizer picks 127 for zeros;
  // 128 is the largest scale the GPU expert kernels take)
  const int layer = 1, expert = 6;
  const std::string w3 = fmt::format("{}{}.block_sparse_moe.experts.{}.w3", kPrefix, layer, expert);
  rewrite_checkpoint(d.path, [&](const std::string& n, DType, std::vector<int64_t>&, std::vector<uint8_t>& b) {
    if (n == w3 + ".weight") std::memset(b.data(), 0, 16);  // row 0, elements 0..31
    if (n == w3 + ".weight_scale") b[0] = 128;
    return true;
  });
  const PreparedLayout L = plan_prepared(spec);
  const std::vector<uint8_t> arena = fill_arena(spec, d.path, L, 0xa5);
  SafetensorsSet files = SafetensorsSet::open(d.path);
  // every expert row of every MoE layer: the file's bytes, gate/up interleaved
  size_t rows_checked = 0;
  for (int l = 0; l < spec.num_layers; ++l) {
    const PreparedLayerLayout& Y = L.layers[size_t(l)];
    if (!Y.moe) continue;
    for (int e = 0; e < spec.num_experts; ++e) {
      const std::string X = fmt::format("{}{}.block_sparse_moe.experts.{}.", kPrefix, l, e);
      for (int64_t r = 0; r < Y.w13.codes.rows; ++r) {
        const TensorView& src = files.get(X + ((r & 1) ? "w3" : "w1") + ".weight");
        const TensorView& ssrc = files.get(X + ((r & 1) ? "w3" : "w1") + ".weight_scale");
        const int64_t sr = r / 2, ld = src.shape[1], sb = ssrc.shape[1];
        const uint8_t* dst = arena.data() + Y.w13.codes.offset + uint64_t(e) * Y.w13.codes.slot_bytes() +
                             uint64_t(r) * Y.w13.codes.row_bytes;
        const uint8_t* sdst = arena.data() + Y.w13.scales.offset + uint64_t(e) * Y.w13.scales.slot_bytes() +
                              uint64_t(r) * Y.w13.scales.row_bytes;
        ASSERT_EQ(std::memcmp(dst, src.data + sr * ld, size_t(ld)), 0) << "layer " << l << " expert " << e << " w13 row " << r;
        ASSERT_EQ(std::memcmp(sdst, ssrc.data + sr * sb, size_t(sb)), 0) << "layer " << l << " expert " << e << " w13 scales row " << r;
        ++rows_checked;
      }
    }
  }
  EXPECT_GT(rows_checked, 0u);
  const PreparedLayerLayout& Y = L.layers[size_t(layer)];
  EXPECT_EQ(arena[Y.w13.scales.offset + uint64_t(expert) * Y.w13.scales.slot_bytes() + 1 * Y.w13.scales.row_bytes], 128);
}

// Mxfp4-AttnFP8: the FP8 per-tensor projections and the MXFP4 experts both go into the arena as
// stored (codes, the tensor scale on each row), and its BF16 tensors go into BF16 tensors, so the
// arena dequantizes to exactly what the CPU reference loads from the files.
TEST(QuantizedCheckpoint, AttnFp8AndMxfp4ArenaHoldsTheCheckpointExactly) {
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  TempDir d;
  write_tiny(d.path, SyntheticFormat::Mxfp4AttnFp8, opt);
  SCOPED_TRACE("seed " + std::to_string(opt.seed));
  {
    SafetensorsSet files = SafetensorsSet::open(d.path);
    WeightBinding bind = bind_weights(build_checkpoint_table(spec, files, d.path), files);
    EXPECT_EQ(arena_requantization_note(bind, prepare_options_for(bind, {})), "");
  }
  const PreparedLayout L = plan_prepared(spec);
  const std::vector<uint8_t> arena = fill_arena(spec, d.path, L);
  ModelWeights back = dequantize_prepared(L, host_arena_reader(arena));
  ModelWeights files_w = load_model_weights(d.path, spec);
  expect_same_weights(spec, back, files_w, "arena vs files");
  // an MXFP8 checkpoint is held exactly in the arena prepare_options_for asks for (no note), and
  // rounded again into the default arena (row-scaled FP8 projections, MXFP4 experts): the note says so
  TempDir d8;
  write_tiny(d8.path, SyntheticFormat::Mxfp8, opt);
  SafetensorsSet f8 = SafetensorsSet::open(d8.path);
  WeightBinding b8 = bind_weights(build_checkpoint_table(spec, f8, d8.path), f8);
  EXPECT_EQ(arena_requantization_note(b8, prepare_options_for(b8, {})), "");
  const std::string note = arena_requantization_note(b8, PrepareOptions{});
  EXPECT_TRUE(note.find("mxfp8 projections") != std::string::npos && note.find("mxfp8 experts") != std::string::npos &&
              note.find("dense / lm_head") == std::string::npos)
      << note;  // MXFP8 dense layers go into BF16 exactly
}

// MXFP8 (the official release): prepare_options_for asks for MXFP8 projections and experts, and the
// arena then holds every attention and expert linear's codes and block scales as the file stores
// them (the fused q|k|v|iq|ik rows and O, tiled codes untiled for the comparison; the interleaved
// gate/up rows), so the whole arena dequantizes to exactly what the CPU reference loads from the
// files (dense layers and lm_head go into BF16 exactly). A block scale the GPU kernels cannot multiply
// exactly is refused naming the tensor, row and block, unless the block's codes are all zero (then
// it is stored as 127: the same zeros).
TEST(QuantizedCheckpoint, Mxfp8ProjectionsEnterTheArenaAsStored) {
  const ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  TempDir d;
  write_tiny(d.path, SyntheticFormat::Mxfp8, opt);
  SCOPED_TRACE("seed " + std::to_string(opt.seed));
  PrepareOptions po;
  {
    SafetensorsSet files = SafetensorsSet::open(d.path);
    WeightBinding bind = bind_weights(build_checkpoint_table(spec, files, d.path), files);
    po = prepare_options_for(bind, {});
  }
  ASSERT_TRUE(po.mxfp8_projections && po.mxfp8_experts);
  EXPECT_TRUE(prepare_options_for(d.path.string(), spec, {}).mxfp8_projections);  // the directory overload
  const PreparedLayout L = plan_prepared(spec, po);
  ASSERT_TRUE(L.layers[0].qkv.mx() && L.layers[0].o.mx());
  for (const auto& Y : L.layers)
    if (Y.moe) ASSERT_TRUE(Y.w13.fp8() && Y.w2.fp8() && (Y.shared_w13.codes.empty() || Y.shared_w13.fp8()));
  EXPECT_EQ(L.layers[0].qkv.scales.cols, (spec.hidden + 31) / 32);
  const std::vector<uint8_t> arena = fill_arena(spec, d.path, L);
  ModelWeights back = dequantize_prepared(L, host_arena_reader(arena));
  ModelWeights files_w = load_model_weights(d.path, spec);
  int compared = 0;
  auto same = [&](const Mat& a, const Mat& b, const std::string& what) {
    ASSERT_EQ(a.rows, b.rows) << what;
    ASSERT_EQ(a.cols, b.cols) << what;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a.data.size(); ++i)
      if (std::memcmp(&a.data[i], &b.data[i], 4) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " values differ, first at " << first << ": " << a.data[first]
                       << " vs " << b.data[first];
    ++compared;
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    const LayerWeights &a = back.layers[size_t(l)], &b = files_w.layers[size_t(l)];
    const std::string P = fmt::format("layer {} ", l);
    same(a.wq, b.wq, P + "wq");
    same(a.wk, b.wk, P + "wk");
    same(a.wv, b.wv, P + "wv");
    same(a.wo, b.wo, P + "wo");
    if (spec.sparse(l)) {
      same(a.wiq, b.wiq, P + "index wq");
      same(a.wik, b.wik, P + "index wk");
    }
  }
  EXPECT_GT(compared, 0);
  expect_same_weights(spec, back, files_w, "MXFP8 arena vs files");  // every weight, experts included
  // the bytes: layer 1's O codes (untiled) and block scales are the file's
  {
    SafetensorsSet files = SafetensorsSet::open(d.path);
    const std::string wo = std::string(kPrefix) + "1.self_attn.o_proj";
    const TensorView& codes = files.get(wo + ".weight");
    const TensorView& scales = files.get(wo + ".weight_scale_inv");
    const PFp8& O = L.layers[1].o;
    std::vector<uint8_t> rows(size_t(O.codes.rows * O.codes.row_bytes));
    untile_rows_to(arena.data() + O.codes.offset, O.codes.rows, O.codes.row_bytes, rows.data());
    const int64_t K = O.codes.cols, B = O.scales.cols;
    for (int64_t r = 0; r < O.codes.rows; ++r) {
      ASSERT_EQ(std::memcmp(rows.data() + r * O.codes.row_bytes, codes.data + r * K, size_t(K)), 0) << "o row " << r;
      ASSERT_EQ(std::memcmp(arena.data() + O.scales.offset + r * O.scales.row_bytes, scales.data + r * B, size_t(B)), 0)
          << "o scales row " << r;
    }
  }
  // a block scale outside 2^-123 .. 2^7 with nonzero codes: refused, named; with zero codes: 127
  const std::string wq = std::string(kPrefix) + "2.self_attn.q_proj";
  auto with_scale = [&](const char* name, uint8_t s, bool zero_codes) {
    fs::path p = d.path / name;
    SyntheticOptions o2 = opt;
    o2.format = SyntheticFormat::Mxfp8;
    write_synthetic_checkpoint(p, spec, o2);
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == wq + ".weight_scale_inv") b[size_t(3 * shape[1] + 1)] = s;  // row 3, block 1
      if (n == wq + ".weight" && zero_codes) std::fill_n(b.begin() + 3 * shape[1] + 32, 32, uint8_t(0x80));  // -0
      return true;
    });
    return p;
  };
  {
    const fs::path p = with_scale("big", 140, false);
    const std::string m = error_of([&] { fill_arena(spec, p, L); });
    EXPECT_TRUE(m.find("layer 2 qkv") != std::string::npos && m.find("block 1") != std::string::npos &&
                m.find("140") != std::string::npos)
        << m;
    const std::string m0 = error_of([&] { fill_arena(spec, with_scale("small", 2, false), L); });
    EXPECT_TRUE(m0.find("block 1") != std::string::npos && m0.find(" 2 (2^-125)") != std::string::npos) << m0;
  }
  {  // a block the OCP rule would scale otherwise (codes 1.0, far below the top binade): stored as is,
     // not re-quantized (which would pick scale - 8 with code 256's)
    const fs::path p = d.path / "noncanonical";
    write_synthetic_checkpoint(p, spec, [&] { SyntheticOptions o2 = opt; o2.format = SyntheticFormat::Mxfp8; return o2; }());
    uint8_t file_scale = 0;
    rewrite_checkpoint(p, [&](const std::string& n, DType, std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      if (n == wq + ".weight") std::fill_n(b.begin(), 32, uint8_t(0x38));  // row 0, block 0: e4m3 1.0
      if (n == wq + ".weight_scale_inv") file_scale = b[0];
      (void)shape;
      return true;
    });
    const std::vector<uint8_t> a = fill_arena(spec, p, L);
    EXPECT_EQ(a[L.layers[2].qkv.scales.offset], file_scale) << "the block was re-quantized";
  }
  {
    const fs::path p = with_scale("zero", 0, true);
    const std::vector<uint8_t> a = fill_arena(spec, p, L);
    EXPECT_EQ(a[L.layers[2].qkv.scales.offset + 3 * uint64_t(L.layers[2].qkv.scales.row_bytes) + 1], 127);
    ModelWeights w = dequantize_prepared(L, host_arena_reader(a)), f = load_model_weights(p, spec);
    same(w.layers[2].wq, f.layers[2].wq, "zero block");
  }
}

TEST(QuantConfig, PatternsAndRules) {
  EXPECT_TRUE(quant_pattern_matches("lm_head", "language_model.lm_head"));
  EXPECT_TRUE(quant_pattern_matches("lm_head", "lm_head"));
  EXPECT_FALSE(quant_pattern_matches("lm_head", "language_model.xlm_head"));
  EXPECT_TRUE(quant_pattern_matches("*self_attn*", "a.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(quant_pattern_matches("*self_attn", "a.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(quant_pattern_matches("*.gate", "m.block_sparse_moe.gate"));
  EXPECT_FALSE(quant_pattern_matches("*.gate", "m.block_sparse_moe.gate_proj"));
  EXPECT_TRUE(quant_pattern_matches("*experts.1?.*", "m.experts.12.w1"));
  EXPECT_FALSE(quant_pattern_matches("*experts.1?.*", "m.experts.2.w1"));
  EXPECT_FALSE(quant_pattern_matches("experts", "m.experts.12.w1"));  // a plain name matches whole components
  EXPECT_TRUE(quant_pattern_matches("l?yer", "layer"));

  QuantConfig c = parse_quant_config(R"({"text_config": {}, "quantization_config": {"quant_method": "quark",
      "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}},
      "layer_quant_config": {"*self_attn*": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}}},
      "exclude": ["lm_head", "*self_attn.o_proj"]}})");
  EXPECT_EQ(c.method, QuantMethod::Quark);
  std::string why;
  EXPECT_EQ(c.expected("x.layers.1.block_sparse_moe.experts.0.w1", &why), WeightQuant::Mxfp4);
  EXPECT_EQ(why, "global_quant_config");
  EXPECT_EQ(c.expected("x.layers.1.self_attn.q_proj", &why), WeightQuant::Fp8Tensor);
  EXPECT_EQ(why, "layer_quant_config '*self_attn*'");
  EXPECT_EQ(c.expected("x.layers.1.self_attn.o_proj", &why), WeightQuant::Float);  // exclude wins
  EXPECT_EQ(why, "excluded by '*self_attn.o_proj'");
  EXPECT_EQ(c.expected("language_model.lm_head"), WeightQuant::Float);

  // layer rules apply in the file's order (the first that matches), not sorted by pattern
  QuantConfig o = parse_quant_config(R"({"quantization_config": {"quant_method": "quark",
      "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}},
      "layer_quant_config": {"*self_attn*": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}},
                             "*o_proj": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}}}}})");
  ASSERT_EQ(o.layers.size(), 2u);
  EXPECT_EQ(o.layers[0].pattern, "*self_attn*");
  EXPECT_EQ(o.expected("x.layers.1.self_attn.o_proj", &why), WeightQuant::Fp8Tensor);
  EXPECT_EQ(why, "layer_quant_config '*self_attn*'");

  QuantConfig m = parse_quant_config(R"({"quantization_config": {"quant_method": "mxfp8",
      "weight_block_size": [1, 32], "modules_to_not_convert": ["lm_head"]}})");
  EXPECT_EQ(m.expected("a.mlp.up_proj"), WeightQuant::Mxfp8);
  EXPECT_EQ(m.expected("a.lm_head"), WeightQuant::Float);
  EXPECT_EQ(parse_quant_config(R"({"vocab_size": 3})").method, QuantMethod::None);

  auto refusal = [](const std::string& text) { return error_of([&] { parse_quant_config(text, "cfg.json"); }); };
  auto has = [](const std::string& m, const std::string& s) { return m.find(s) != std::string::npos; };
  std::string e = refusal(R"({"quantization_config": {"quant_method": "gptq"}})");
  EXPECT_TRUE(has(e, "cfg.json") && has(e, "'gptq'")) << e;
  e = refusal(R"({"quantization_config": {"quant_method": "mxfp8", "weight_block_size": [1, 64]}})");
  EXPECT_TRUE(has(e, "weight_block_size") && has(e, "[1,64]")) << e;
  e = refusal(R"({"quantization_config": {"quant_method": "quark", "global_quant_config":
      {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 16}}}})");
  EXPECT_TRUE(has(e, "global_quant_config.weight") && has(e, "group_size 16")) << e;
  e = refusal(R"({"quantization_config": {"quant_method": "quark", "global_quant_config":
      {"weight": {"dtype": "int4", "qscheme": "per_group", "group_size": 32}}}})");
  EXPECT_TRUE(has(e, "'int4'")) << e;
  e = refusal(R"({"quantization_config": {"quant_method": "quark", "global_quant_config": {}, "exclude": ["re:.*"]}})");
  EXPECT_TRUE(has(e, "exclude") && has(e, "re:.*") && has(e, "not supported")) << e;
  e = refusal(R"({"quantization_config": {"quant_method": "quark", "global_quant_config": {}, "exclude": "lm_head"}})");
  EXPECT_TRUE(has(e, "exclude") && has(e, "list")) << e;
}
