// Synthetic checkpoints (model/synthetic.h) and the make-tiny / info commands: the written files
// load back to exactly the in-memory generator's values, in every spelling; the values look like
// an initialized model (std ~0.06, non-zero norms and bias, fp32 router); the presets have the
// promised shapes; and the footprint matches hand-computed byte counts.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "common/process.h"
#include "common/temp_dir.h"
#include "core/check.h"
#include "model/footprint.h"
#include "model/load_weights.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight_table.h"
#include "text/template_chat.h"
#include "text/tiny_chat_template.h"
#include "text/tokenizer.h"

using namespace m3;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using m3::test::TempDir;

// (exit code, stdout + stderr) of a shell command
std::pair<int, std::string> run(const std::string& cmd) {
  const m3::test::CmdResult r = m3::test::run_shell(cmd);
  return {r.rc, r.out};
}
using m3::test::read_file;

// Every tensor of a and b bitwise equal (the file round trip is exact by construction).
void expect_same_weights(const ModelSpec& spec, ModelWeights& a, ModelWeights& b) {
  for (const auto& e : build_weight_table(spec).entries) {
    size_t n = 1;
    for (auto d : e.shape) n *= size_t(d);
    const float* pa = host_destination(a, e);
    const float* pb = host_destination(b, e);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (std::memcmp(pa + i, pb + i, 4) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << e.describe() << ": first difference at [" << first << "]: " << pa[first] << " vs "
                       << pb[first];
  }
}

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  double m = s / double(v.size());
  return std::sqrt(s2 / double(v.size()) - m * m);
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

}  // namespace

TEST(MakeTiny, WrittenCheckpointLoadsToGeneratorValues) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  opt.seed = seed;
  opt.mtp = true;
  TempDir d;
  write_synthetic_checkpoint(d.path, spec, opt);
  EXPECT_TRUE(load_model_spec(d.path) == spec);
  ModelWeights loaded = load_model_weights(d.path, spec);
  ModelWeights mem = synthetic_weights(spec, opt);
  expect_same_weights(spec, loaded, mem);

  // released layout: fp32 router and bias, bf16 elsewhere, vision + mtp tensors present
  SafetensorsSet set = SafetensorsSet::open(d.path);
  EXPECT_EQ(set.get("language_model.model.layers.1.block_sparse_moe.gate.weight").dtype, DType::F32);
  EXPECT_EQ(set.get("language_model.model.layers.2.block_sparse_moe.e_score_correction_bias").dtype, DType::F32);
  EXPECT_EQ(set.get("language_model.model.layers.0.mlp.up_proj.weight").dtype, DType::BF16);
  WeightBinding b = bind_weights(build_weight_table(spec), set);
  EXPECT_EQ(b.ignored.size(), 6u);  // 5 vision-side + 1 mtp
  json cfg = json::parse(read_file(d.path / "config.json"));
  EXPECT_TRUE(cfg["text_config"].contains("sparse_attention_config"));
  EXPECT_TRUE(cfg["text_config"].contains("moe_layer_freq"));
}

TEST(MakeTiny, ValuesLookInitialized) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ModelSpec spec = synthetic_preset("tiny");
  SyntheticOptions opt;
  opt.seed = seed;
  ModelWeights w = synthetic_weights(spec, opt);
  // 131072 samples: the sample std has a relative spread of about 1/sqrt(2n) = 0.2 %; 3 % also
  // absorbs bf16 rounding (relative 2^-9 per value).
  EXPECT_NEAR(stddev(w.layers[1].wq.data), 0.06, 0.06 * 0.03);
  EXPECT_NEAR(stddev(w.embed.data), 0.06, 0.06 * 0.03);
  EXPECT_NEAR(stddev(w.layers[2].router.data), 0.06, 0.06 * 0.05);  // 4096 samples: 1.1 % spread
  // norms and bias: non-zero, 256 / 16 samples (loose: 25 % and 60 %)
  EXPECT_NEAR(stddev(w.final_norm), 0.2, 0.05);
  EXPECT_NEAR(stddev(w.layers[1].router_bias), 0.05, 0.03);
  for (float x : w.layers[3].router_bias) EXPECT_NE(x, 0.f);
  // bf16 tensors hold bf16 values; the fp32 router does not (almost surely)
  int not_bf16 = 0;
  for (float x : w.layers[1].router.data) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    not_bf16 += (u & 0xffff) != 0;
  }
  EXPECT_GT(not_bf16, 4000);
  for (float x : w.layers[1].wq.data) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    ASSERT_EQ(u & 0xffff, 0u);
  }
  // different tensors and different seeds give different values
  EXPECT_NE(w.layers[1].wq.data[0], w.layers[2].wq.data[0]);
  opt.seed = seed + 1;
  ModelWeights w2 = synthetic_weights(spec, opt);
  EXPECT_NE(w.embed.data, w2.embed.data);
}

TEST(MakeTiny, Presets) {
  for (const auto& n : synthetic_preset_names()) EXPECT_NO_THROW(synthetic_preset(n).validate()) << n;
  ModelSpec r = synthetic_preset("real-heads");
  EXPECT_EQ(r.num_heads, 64);
  EXPECT_EQ(r.num_kv_heads, 4);
  EXPECT_EQ(r.head_dim, 128);
  EXPECT_EQ(r.index_heads, 4);
  EXPECT_EQ(r.index_dim, 128);
  EXPECT_EQ(r.index_block, 128);
  EXPECT_EQ(r.hidden, 1024);
  EXPECT_GE(r.num_sparse_layers(), 4);
  double bytes = 0;
  for (const auto& e : build_weight_table(r).entries) {
    double n = double(dtype_size(e.dtype));
    for (auto d : e.shape) n *= double(d);
    bytes += n;
  }
  EXPECT_LT(bytes, 230e6) << "real-heads should stay near 200 MB";
  ModelSpec sm = synthetic_preset("small");
  EXPECT_EQ(sm.hidden, 512);
  EXPECT_EQ(sm.num_layers, 6);
  EXPECT_EQ(sm.vocab_size, 4096);
  EXPECT_FALSE(synthetic_preset_writable("real"));
  try {
    synthetic_preset("huge");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("real-heads"), std::string::npos) << e.what();
  }
}

TEST(MakeTiny, Command) {
  const uint64_t seed = fresh_seed() % 1000000;
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir d;
  const std::string bin = M3_BINARY;
  auto [rc, out] = run(bin + " make-tiny --out " + (d.path / "a").string() + " --seed " + std::to_string(seed));
  ASSERT_EQ(rc, 0) << out;
  ModelSpec spec = load_model_spec(d.path / "a");
  EXPECT_TRUE(spec == synthetic_preset("tiny"));
  SyntheticOptions opt;
  opt.seed = seed;
  ModelWeights mem = synthetic_weights(spec, opt);
  ModelWeights a = load_model_weights(d.path / "a", spec);
  expect_same_weights(spec, a, mem);
  // the chat template: the M3-style one that the template matrix checks against Python jinja2,
  // found as the checkpoint's, its markers each one added token of the tiny tokenizer
  ASSERT_TRUE(fs::exists(d.path / "a" / "chat_template.jinja"));
  EXPECT_EQ(read_file(d.path / "a" / "chat_template.jinja"),
            read_file(fs::path(M3_TEST_DATA) / "templates" / "m3_style.jinja"));
  EXPECT_EQ(text::load_chat_template_source(d.path / "a"), std::string(text::tiny_chat_template()));
  {
    text::Tokenizer tok = text::Tokenizer::load((d.path / "a").string(), spec.vocab_size);
    for (const char* marker : {"]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", "]<]minimax[>["})
      EXPECT_EQ(tok.encode(marker, false).size(), 1u) << marker;
  }

  // the other spellings hold the same weights
  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "b").string() + " --seed " + std::to_string(seed) +
                          " --normalized-config --block-sparse-moe-dense --mtp --no-vision");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(load_model_spec(d.path / "b") == spec);
  EXPECT_TRUE(json::parse(read_file(d.path / "b" / "config.json"))["text_config"].contains("layer_types"));
  SafetensorsSet bset = SafetensorsSet::open(d.path / "b");
  EXPECT_NE(bset.find("language_model.model.layers.0.block_sparse_moe.gate_proj.weight"), nullptr);
  EXPECT_EQ(bset.find("vision_tower.vision_model.pre_layrnorm.weight"), nullptr);
  ModelWeights bw = load_model_weights(d.path / "b", spec);
  expect_same_weights(spec, bw, mem);

  // sharded output: the same weights through model.safetensors.index.json
  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "s").string() + " --seed " + std::to_string(seed) +
                          " --shards 3");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(d.path / "s" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(d.path / "s" / "model.safetensors"));
  {
    SafetensorsSet sset = SafetensorsSet::open(d.path / "s");
    EXPECT_EQ(sset.files().size(), 3u);
    for (const auto& f : sset.files()) EXPECT_GT(f->tensors().size(), 0u) << f->path();
  }
  ModelWeights sw = load_model_weights(d.path / "s", spec);
  expect_same_weights(spec, sw, mem);

  // deterministic: the same seed writes the same bytes; another seed does not
  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "c").string() + " --seed " + std::to_string(seed));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(read_file(d.path / "a" / "model.safetensors") == read_file(d.path / "c" / "model.safetensors"));
  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "e").string() + " --seed " + std::to_string(seed + 1));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_FALSE(read_file(d.path / "a" / "model.safetensors") == read_file(d.path / "e" / "model.safetensors"));

  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "r").string() + " --preset real");
  EXPECT_NE(rc, 0) << out;
  std::tie(rc, out) = run(bin + " make-tiny --out " + (d.path / "r").string() + " --preset nope");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("nope"), std::string::npos) << out;
}

TEST(MakeTiny, InfoCommand) {
  const std::string bin = M3_BINARY;
  auto [rc, out] = run(bin + " info --model " + std::string(M3_TEST_DATA) + "/tiny-m3-a");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1-3      sparse attention (MSA) + MoE"), std::string::npos) << out;
  EXPECT_NE(out.find("209 claimed by the weight table, 27 ignored"), std::string::npos) << out;
  std::tie(rc, out) = run(bin + " info --preset real");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("active per token 23.50 B (+1.23 B lm_head)"), std::string::npos) << out;
  std::tie(rc, out) = run(bin + " info --config " + std::string(M3_TEST_DATA) + "/tiny-m3-a/config.json --tp 2");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("per rank: 4 query heads, 1 KV head(s)"), std::string::npos) << out;
  // past the KV heads: replicated; tiny's 64 expert columns over 4 ranks would cut an MXFP4 block
  std::tie(rc, out) = run(bin + " info --preset real --tp 8");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("per rank: 8 query heads, 1 KV head(s) (replicated"), std::string::npos) << out;
  std::tie(rc, out) = run(bin + " info --config " + std::string(M3_TEST_DATA) + "/tiny-m3-a/config.json --tp 4");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("cannot split this model over 4 ranks: prepare: intermediate_size = 64 over 4 ranks gives 16"),
            std::string::npos)
      << out;
  std::tie(rc, out) = run(bin + " info");
  EXPECT_NE(rc, 0) << out;
  // a checkpoint with an unclaimed tensor is reported by info
  TempDir d;
  ModelSpec spec = synthetic_preset("tiny");
  write_synthetic_checkpoint(d.path, spec);
  {
    SafetensorsSet set = SafetensorsSet::open(d.path);
    SafetensorsWriter w;
    for (const auto& n : set.names()) {
      const TensorView& v = set.get(n);
      w.add(n, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes));
    }
    w.add("language_model.model.layers.9.extra.weight", DType::BF16, {2}, std::vector<uint8_t>(4, 0));
    w.write(d.path / "model2.safetensors");
  }
  fs::rename(d.path / "model2.safetensors", d.path / "model.safetensors");
  std::tie(rc, out) = run(bin + " info --model " + d.path.string());
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("layers.9.extra.weight"), std::string::npos) << out;
}

// The footprint against byte counts written out by hand for the tiny shape.
TEST(Footprint, TinyByHand) {
  ModelSpec s = synthetic_preset("tiny");
  const double H = 256, V = 1024, hd = 64, nq = 8, nkv = 2, E = 16, K = 4, I = 64, S = 64, D = 256, ih = 2, id = 64;
  const double Ls = 3, Lf = 1, L = 4;
  Footprint fp = compute_footprint(s);
  // attention q/k/v/index: fp8 bytes + 4 bytes per output row
  double qkv_rows_full = nq * hd + 2 * nkv * hd, qkv_rows_sparse = qkv_rows_full + ih * id + id;
  double qkv = Lf * (qkv_rows_full * H + 4 * qkv_rows_full) + Ls * (qkv_rows_sparse * H + 4 * qkv_rows_sparse);
  double o = L * (H * nq * hd + 4 * H);
  // MXFP4: half a byte per weight + one byte per 32 inputs of each row
  auto mx = [](double rows, double cols) { return rows * cols / 2 + rows * std::ceil(cols / 32); };
  double expert = 2 * mx(I, H) + mx(H, I);
  double routed_tok = Ls * K * expert, routed_all = Ls * E * expert;
  double shared = Ls * (2 * mx(S, H) + mx(H, S));
  double router = Ls * (E * H * 4 + E * 4);
  double dense = Lf * 3 * D * H * 2;
  double norms = (L * (2 * H + 2 * hd) + Ls * 2 * id + H) * 2;
  double lm = V * H * 2, emb_tok = H * 2;
  double per_tok = qkv + o + routed_tok + shared + router + dense + norms + lm + emb_tok;
  double stored = qkv + o + routed_all + shared + router + dense + norms + lm + V * H * 2;
  EXPECT_DOUBLE_EQ(fp.weight_bytes_per_token, per_tok);
  EXPECT_DOUBLE_EQ(fp.weight_bytes, stored);
  double attn_params = Lf * qkv_rows_full * H + Ls * qkv_rows_sparse * H + L * H * nq * hd;
  double active = attn_params + Ls * (K + 1) * 3 * I * H + Ls * (E * H + E) + Lf * 3 * D * H +
                  (L * (2 * H + 2 * hd) + Ls * 2 * id + H) + H;
  EXPECT_DOUBLE_EQ(fp.active_params, active);
  EXPECT_DOUBLE_EQ(fp.lm_head_params, V * H);
  EXPECT_DOUBLE_EQ(fp.total_params, active - H - Ls * K * 3 * I * H + Ls * E * 3 * I * H + V * H + V * H);
  EXPECT_DOUBLE_EQ(fp.kv_bytes_per_token, L * 2 * nkv * hd);
  EXPECT_DOUBLE_EQ(fp.index_k_bytes_per_token, Ls * id);
  // decode step at context 100: full layers read all 100 tokens' K/V, sparse layers at most
  // topk * block = 64 tokens, and the whole index-K cache
  EXPECT_DOUBLE_EQ(cache_read_bytes_per_step(s, {}, 100), Lf * 100 * 2 * nkv * hd + Ls * (64 * 2 * nkv * hd + 100 * id));
  // real model: about 23.5 B active, about 19.4 GB read per token (m3-model.md)
  Footprint real = compute_footprint(synthetic_preset("real"));
  EXPECT_NEAR(real.active_params / 1e9, 23.5, 0.1);
  EXPECT_NEAR(real.weight_bytes_per_token / 1e9, 19.4, 0.8);
  FootprintOptions tp4;
  tp4.tp = 4;
  EXPECT_NEAR(compute_footprint(synthetic_preset("real"), tp4).weight_bytes_per_token / 1e9, 19.4 / 4, 0.4);
}
