// The weight table and its binding to checkpoints: the fixture binds with its vision tensors
// ignored; missing, unclaimed, wrong-shape and wrong-dtype tensors are errors naming the tensor;
// both dense-MLP spellings are accepted (and both at once rejected); F16 / F32 / MXFP8 tensors
// convert correctly; and loading tiny-m3-a reproduces the raw bf16 bytes of every tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <span>

#include "common/compare.h"
#include "common/temp_dir.h"
#include "core/check.h"
#include "core/codecs.h"
#include "model/load_weights.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight_table.h"

using namespace m3;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(M3_TEST_DATA) + "/tiny-m3-a";

using m3::test::TempDir;

// One tensor of a test checkpoint: its bytes are a constant pattern unless given.
struct T {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The tensors the table for `spec` expects (names[alt] where an entry has alternatives).
std::vector<T> tensors_for(const ModelSpec& spec, size_t alt = 0, const std::string& prefix = "language_model.") {
  std::vector<T> out;
  for (const auto& e : build_weight_table(spec, prefix).entries)
    out.push_back({e.names[std::min(alt, e.names.size() - 1)], e.dtype, e.shape, {}});
  return out;
}

void write_checkpoint(const fs::path& dir, const std::vector<T>& ts) {
  SafetensorsWriter w;
  for (const auto& t : ts) {
    if (!t.bytes.empty()) {
      w.add(t.name, t.dtype, t.shape, t.bytes);
    } else {
      w.add(t.name, t.dtype, t.shape, [](uint8_t* d, size_t n) { std::memset(d, 0x3c, n); });
    }
  }
  w.write(dir / "model.safetensors");
}

std::string bind_error(const fs::path& dir, const ModelSpec& spec) {
  try {
    SafetensorsSet set = SafetensorsSet::open(dir);
    bind_weights(build_weight_table(spec, detect_text_prefix(set)), set);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

T* find(std::vector<T>& ts, const std::string& suffix) {
  for (auto& t : ts)
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return &t;
  return nullptr;
}

// Independent reader for the fixture: header via nlohmann, bytes via ifstream, bf16 by shifting.
struct RawFile {
  json header;
  std::vector<char> bytes;
  size_t base = 0;
  explicit RawFile(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n));
    base = 8 + n;
  }
  std::vector<float> values(const std::string& name) const {
    const json& e = header.at(name);
    size_t b = e["data_offsets"][0], en = e["data_offsets"][1];
    std::vector<float> out;
    if (e["dtype"] == "F32") {
      out.resize((en - b) / 4);
      std::memcpy(out.data(), bytes.data() + base + b, en - b);
    } else {
      EXPECT_EQ(e["dtype"], "BF16") << name;
      out.resize((en - b) / 2);
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + base + b + 2 * i, 2);
        uint32_t u = uint32_t(h) << 16;
        std::memcpy(&out[i], &u, 4);
      }
    }
    return out;
  }
};

// Bitwise equality of two float arrays (the loads below are exact by construction); reports the
// first differing element and how many differ.
::testing::AssertionResult bitwise_equal(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ; first at [" << first
                                       << "]: got " << got[first] << " want " << want[first];
}

}  // namespace

TEST(WeightTable, TinyTableShape) {
  ModelSpec s = synthetic_preset("tiny");
  WeightTable t = build_weight_table(s);
  // 3 global + per layer: 2 norms + 6 attention; sparse layers +4 index; dense layer +3;
  // MoE layers +2 routing + 3 per expert + 3 shared
  size_t want = 3 + 4 * 8 + 3 * 4 + 3 + 3 * (2 + 3 * 16 + 3);
  EXPECT_EQ(t.entries.size(), want);
  std::set<std::string> names;
  for (const auto& e : t.entries)
    for (const auto& n : e.names) EXPECT_TRUE(names.insert(n).second) << "listed twice: " << n;
  for (const auto& e : t.entries) {
    using V = std::vector<int64_t>;
    if (e.role == WeightRole::Router) {
      EXPECT_EQ(e.dtype, DType::F32);
      EXPECT_EQ(e.shape, (V{16, 256}));
    }
    if (e.role == WeightRole::Wo) {
      EXPECT_EQ(e.shape, (V{256, 512}));
    }
    if (e.role == WeightRole::IndexWq) {
      EXPECT_EQ(e.shape, (V{128, 256}));
    }
    if (e.role == WeightRole::IndexWk) {
      EXPECT_EQ(e.shape, (V{64, 256}));
    }
    if (e.role == WeightRole::ExpertDown) {
      EXPECT_EQ(e.shape, (V{256, 64}));
    }
    if (e.role == WeightRole::DenseGate) {
      EXPECT_EQ(e.names.size(), 2u);
    }
    EXPECT_EQ(e.names[0].rfind("language_model.", 0), 0u);
  }
}

TEST(WeightTable, BindsTheFixture) {
  SafetensorsSet set = SafetensorsSet::open(kFixture);
  ModelSpec spec = load_model_spec(kFixture);
  EXPECT_EQ(detect_text_prefix(set), "language_model.");
  WeightBinding b = bind_weights(build_weight_table(spec), set);
  EXPECT_EQ(b.weights.size(), 209u);
  EXPECT_EQ(b.ignored.size(), 27u);
  for (const auto& n : b.ignored)
    EXPECT_TRUE(n.rfind("vision_tower.", 0) == 0 || n.rfind("multi_modal_projector.", 0) == 0 ||
                n.rfind("patch_merge_mlp.", 0) == 0)
        << n;
  // the fixture spells the dense MLP block_sparse_moe.*_proj (transformers 5.17)
  for (const auto& w : b.weights) {
    if (w.entry->role == WeightRole::DenseUp) {
      EXPECT_EQ(w.tensor->name, "language_model.model.layers.0.block_sparse_moe.up_proj.weight");
    }
  }
}

TEST(WeightTable, BothDenseSpellings) {
  ModelSpec s = synthetic_preset("tiny");
  TempDir d1, d2, d3;
  write_checkpoint(d1.path, tensors_for(s, 0));  // mlp.*
  EXPECT_EQ(bind_error(d1.path, s), "");
  write_checkpoint(d2.path, tensors_for(s, 1));  // block_sparse_moe.*_proj
  EXPECT_EQ(bind_error(d2.path, s), "");
  auto both = tensors_for(s, 0);
  both.push_back({"language_model.model.layers.0.block_sparse_moe.down_proj.weight", DType::BF16, {256, 256}, {}});
  write_checkpoint(d3.path, both);
  std::string msg = bind_error(d3.path, s);
  EXPECT_NE(msg.find("language_model.model.layers.0.mlp.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("block_sparse_moe.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("both present"), std::string::npos) << msg;
}

TEST(WeightTable, MissingTensor) {
  ModelSpec s = synthetic_preset("tiny");
  for (const char* gone : {"layers.2.self_attn.index_k_norm.weight", "layers.3.block_sparse_moe.experts.15.w2.weight",
                           "lm_head.weight", "layers.1.block_sparse_moe.e_score_correction_bias"}) {
    TempDir d;
    auto ts = tensors_for(s);
    T* t = find(ts, gone);
    ASSERT_NE(t, nullptr) << gone;
    std::string full = t->name;
    ts.erase(ts.begin() + (t - ts.data()));
    write_checkpoint(d.path, ts);
    std::string msg = bind_error(d.path, s);
    EXPECT_NE(msg.find("'" + full + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  }
  {  // a dense tensor missing in both spellings names both
    TempDir d;
    auto ts = tensors_for(s);
    T* t = find(ts, "layers.0.mlp.gate_proj.weight");
    ts.erase(ts.begin() + (t - ts.data()));
    write_checkpoint(d.path, ts);
    std::string msg = bind_error(d.path, s);
    EXPECT_NE(msg.find("mlp.gate_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("block_sparse_moe.gate_proj.weight"), std::string::npos) << msg;
  }
}

TEST(WeightTable, UnclaimedTensor) {
  ModelSpec s = synthetic_preset("tiny");
  for (T extra : {T{"language_model.model.layers.4.self_attn.q_proj.weight", DType::BF16, {512, 256}, {}},
                  T{"language_model.model.layers.1.self_attn.q_proj.bias", DType::BF16, {512}, {}},
                  T{"language_model.model.layers.1.block_sparse_moe.experts.16.w1.weight", DType::BF16, {64, 256}, {}},
                  T{"language_model.model.layers.0.self_attn.index_q_norm.weight", DType::BF16, {64}, {}},
                  T{"vision_towerx.weight", DType::BF16, {4}, {}}}) {
    TempDir d;
    auto ts = tensors_for(s);
    ts.push_back(extra);
    write_checkpoint(d.path, ts);
    std::string msg = bind_error(d.path, s);
    EXPECT_NE(msg.find("'" + extra.name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not claimed"), std::string::npos) << msg;
  }
}

TEST(WeightTable, IgnoredTensors) {
  ModelSpec s = synthetic_preset("tiny");
  TempDir d;
  auto ts = tensors_for(s);
  std::vector<std::string> extra = {"vision_tower.vision_model.post_layernorm.weight", "multi_modal_projector.linear_2.bias",
                                    "patch_merge_mlp.linear_1.weight", "mtp.0.enorm.weight",
                                    "language_model.model.mtp.layers.0.self_attn.q_proj.weight",
                                    "language_model.mtp_head.weight"};
  for (const auto& n : extra) ts.push_back({n, DType::BF16, {8}, {}});
  write_checkpoint(d.path, ts);
  SafetensorsSet set = SafetensorsSet::open(d.path);
  WeightBinding b = bind_weights(build_weight_table(s), set);
  std::sort(extra.begin(), extra.end());
  EXPECT_EQ(b.ignored, extra);
  EXPECT_FALSE(is_ignored_tensor("language_model.model.layers.0.mtpx.weight"));
  EXPECT_FALSE(is_ignored_tensor("language_model.model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(is_ignored_tensor("mtp"));
}

TEST(WeightTable, WrongShape) {
  ModelSpec s = synthetic_preset("tiny");
  TempDir d;
  auto ts = tensors_for(s);
  find(ts, "layers.1.self_attn.q_proj.weight")->shape = {512, 255};
  write_checkpoint(d.path, ts);
  std::string msg = bind_error(d.path, s);
  EXPECT_NE(msg.find("'language_model.model.layers.1.self_attn.q_proj.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[512, 255]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [512, 256]"), std::string::npos) << msg;
  // a transposed matrix is a wrong shape too
  TempDir d2;
  ts = tensors_for(s);
  find(ts, "layers.0.self_attn.o_proj.weight")->shape = {512, 256};
  write_checkpoint(d2.path, ts);
  msg = bind_error(d2.path, s);
  EXPECT_NE(msg.find("o_proj.weight' has shape [512, 256], expected [256, 512]"), std::string::npos) << msg;
}

TEST(WeightTable, WrongDtype) {
  ModelSpec s = synthetic_preset("tiny");
  struct C {
    const char* suffix;
    DType dt;
  };
  for (C c : {C{"layers.1.self_attn.k_norm.weight", DType::I16}, C{"layers.2.block_sparse_moe.gate.weight", DType::I32},
              C{"model.embed_tokens.weight", DType::U8}, C{"model.norm.weight", DType::F8_E4M3},
              C{"layers.3.self_attn.v_proj.weight", DType::F64}}) {
    TempDir d;
    auto ts = tensors_for(s);
    T* t = find(ts, c.suffix);
    t->dtype = c.dt;
    write_checkpoint(d.path, ts);
    std::string msg = bind_error(d.path, s);
    EXPECT_NE(msg.find("'" + t->name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dtype " + std::string(dtype_name(c.dt))), std::string::npos) << msg;
  }
}

TEST(WeightTable, BareTextPrefix) {
  ModelSpec s = synthetic_preset("tiny");
  TempDir d;
  write_checkpoint(d.path, tensors_for(s, 0, ""));
  SafetensorsSet set = SafetensorsSet::open(d.path);
  EXPECT_EQ(detect_text_prefix(set), "");
  EXPECT_EQ(bind_error(d.path, s), "");
}

// F32, F16 and MXFP8 tensors convert to the right fp32 values; malformed MXFP8 scales are errors.
TEST(WeightTable, DtypeConversions) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.1f);
  ModelSpec s = synthetic_preset("tiny");
  auto ts = tensors_for(s);
  // zero (bf16 0x0000) everywhere else so the load is quick to check
  for (auto& t : ts) {
    size_t n = dtype_size(t.dtype);
    for (auto x : t.shape) n *= size_t(x);
    t.bytes.assign(n, 0);
  }
  const size_t qn = 512 * 256, kn = 128 * 256, vn = 128 * 256;
  std::vector<float> q(qn), k(kn), v(vn);
  T* tq = find(ts, "layers.0.self_attn.q_proj.weight");
  tq->dtype = DType::F32;
  tq->bytes.resize(qn * 4);
  for (auto& x : q) x = nd(rng);
  std::memcpy(tq->bytes.data(), q.data(), qn * 4);
  T* tk = find(ts, "layers.0.self_attn.k_proj.weight");
  tk->dtype = DType::F16;
  tk->bytes.resize(kn * 2);
  for (size_t i = 0; i < kn; ++i) {
    uint16_t h = f32_to_f16(nd(rng));
    std::memcpy(tk->bytes.data() + 2 * i, &h, 2);
    k[i] = f16_to_f32(h);
  }
  T* tv = find(ts, "layers.0.self_attn.v_proj.weight");
  tv->dtype = DType::F8_E4M3;
  tv->bytes.resize(vn);
  std::vector<uint8_t> scale(128 * 8);
  for (auto& b : scale) b = uint8_t(120 + rng() % 10);
  for (size_t r = 0; r < 128; ++r)
    for (size_t c = 0; c < 256; ++c) {
      uint8_t b = uint8_t(rng() % 256);
      if ((b & 0x7f) == 0x7f) b = 0x10;  // no NaN codes
      tv->bytes[r * 256 + c] = b;
      v[r * 256 + c] = e4m3_to_f32(b) * std::ldexp(1.0f, int(scale[r * 8 + c / 32]) - 127);
    }
  const std::string sname = "language_model.model.layers.0.self_attn.v_proj.weight_scale_inv";
  ts.push_back({sname, DType::U8, {128, 8}, scale});

  TempDir d;
  write_checkpoint(d.path, ts);
  std::ofstream(d.path / "config.json") << model_spec_to_json(s, ConfigSpelling::Released);
  ModelWeights w = load_model_weights(d.path, s);
  EXPECT_TRUE(bitwise_equal(w.layers[0].wq.data, q));  // exact: no conversion
  EXPECT_TRUE(bitwise_equal(w.layers[0].wk.data, k));  // exact: f16 -> f32 is exact
  EXPECT_TRUE(bitwise_equal(w.layers[0].wv.data, v));  // exact: e4m3 x 2^k is exact in f32

  {  // scale missing
    TempDir d2;
    auto ts2 = ts;
    ts2.pop_back();
    write_checkpoint(d2.path, ts2);
    std::string msg = bind_error(d2.path, s);
    EXPECT_NE(msg.find(sname), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  {  // scale of the wrong shape
    TempDir d2;
    auto ts2 = ts;
    ts2.back().shape = {128, 4};
    ts2.back().bytes.resize(128 * 4);
    write_checkpoint(d2.path, ts2);
    std::string msg = bind_error(d2.path, s);
    EXPECT_NE(msg.find(sname), std::string::npos) << msg;
    EXPECT_NE(msg.find("[128, 4], expected [128, 8]"), std::string::npos) << msg;
  }
  {  // a scale for a bf16 weight is claimed by nothing
    TempDir d2;
    auto ts2 = ts;
    ts2.push_back({"language_model.model.layers.0.self_attn.o_proj.weight_scale_inv", DType::U8, {256, 16}, {}});
    write_checkpoint(d2.path, ts2);
    std::string msg = bind_error(d2.path, s);
    EXPECT_NE(msg.find("o_proj.weight_scale_inv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not claimed"), std::string::npos) << msg;
  }
}

// Every tensor of tiny-m3-a loads to exactly the value of its raw bytes.
TEST(WeightTable, LoadsTinyFixtureExactly) {
  ModelSpec spec = load_model_spec(kFixture);
  ModelWeights w = load_model_weights(kFixture, spec);
  RawFile raw(kFixture + "/model.safetensors");
  size_t checked = 0;
  for (const auto& e : build_weight_table(spec).entries) {
    std::string name;
    for (const auto& n : e.names)
      if (raw.header.contains(n)) name = n;
    ASSERT_FALSE(name.empty()) << e.describe();
    std::vector<float> want = raw.values(name);
    size_t n = want.size();
    const float* got = host_destination(w, e);
    // exact: bf16 and f32 convert exactly to f32
    EXPECT_TRUE(bitwise_equal(std::span<const float>(got, n), want)) << e.describe();
    ++checked;
  }
  EXPECT_EQ(checked, 209u);
  // spot checks through the typed struct (not the table), against raw values
  auto embed = raw.values("language_model.model.embed_tokens.weight");
  EXPECT_EQ(w.embed.row(5)[7], embed[5 * 256 + 7]);
  auto w2 = raw.values("language_model.model.layers.2.block_sparse_moe.experts.11.w2.weight");
  EXPECT_EQ(w.layers[2].experts[11].down.row(100)[3], w2[100 * 64 + 3]);
  auto router = raw.values("language_model.model.layers.3.block_sparse_moe.gate.weight");
  EXPECT_EQ(w.layers[3].router.row(15)[255], router[15 * 256 + 255]);
  auto bias = raw.values("language_model.model.layers.1.block_sparse_moe.e_score_correction_bias");
  EXPECT_EQ(w.layers[1].router_bias[9], bias[9]);
  auto dense = raw.values("language_model.model.layers.0.block_sparse_moe.down_proj.weight");
  EXPECT_EQ(w.layers[0].dense.down.row(255)[0], dense[255 * 256]);
  EXPECT_TRUE(w.layers[0].wiq.empty());
  EXPECT_TRUE(w.layers[0].experts.empty());
  EXPECT_EQ(w.layers[1].experts.size(), 16u);
}

TEST(WeightTable, LoadRejectsMismatchedConfig) {
  // the fixture's tensors against a spec with more experts: the router's shape is named
  ModelSpec spec = load_model_spec(kFixture);
  spec.num_experts = 17;
  try {
    load_model_weights(kFixture, spec);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate.weight' has shape [16, 256], expected [17, 256]"), std::string::npos)
        << e.what();
  }
  // ... and against a spec with fewer layers: layer 3's tensors are unclaimed
  spec = load_model_spec(kFixture);
  spec.num_layers = 3;
  spec.attn.pop_back();
  spec.mlp.pop_back();
  try {
    load_model_weights(kFixture, spec);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("language_model.model.layers.3."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not claimed"), std::string::npos) << e.what();
  }
}
