// config.json parsing: both spellings of tiny-m3-a's config give the same ModelSpec, the released
// MiniMax-M3 config gives the "real" preset, writer round trips, and every rejection names the
// field (and the value) it rejects.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <sstream>

#include "core/check.h"
#include "model/config.h"
#include "model/spec.h"
#include "model/synthetic.h"

using namespace m3;
using json = nlohmann::json;

namespace {

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fixture_config() { return read_file(std::string(M3_TEST_DATA) + "/tiny-m3-a/config.json"); }

// tiny-m3-a's text config written by hand in the released spelling (no layer_types, no index_*,
// no rope_parameters): must parse to the same spec as the fixture's normalized one.
const char* kTinyReleased = R"({
  "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
  "model_type": "minimax_m3_vl",
  "text_config": {
    "model_type": "minimax_m3",
    "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "rotary_dim": 32, "rope_theta": 5000000, "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06, "max_position_embeddings": 4096,
    "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "swigluoai", "use_gemma_norm": true, "use_qk_norm": true, "qk_norm_type": "per_head",
    "dense_intermediate_size": 256, "intermediate_size": 64, "shared_intermediate_size": 64,
    "n_shared_experts": 1, "num_local_experts": 16, "num_experts_per_tok": 4,
    "scoring_func": "sigmoid", "use_routing_bias": true, "routed_scaling_factor": 2.0,
    "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "tie_word_embeddings": false,
    "num_mtp_modules": 0,
    "moe_layer_freq": [0, 1, 1, 1],
    "sparse_attention_config": {
      "use_sparse_attention": true, "sparse_num_index_heads": 2, "sparse_index_dim": 64,
      "sparse_block_size": 16, "sparse_topk_blocks": 4, "sparse_local_block": 1,
      "sparse_init_block": 0, "sparse_score_type": "max",
      "sparse_attention_freq": [0, 1, 1, 1], "sparse_disable_index_value": [0, 1, 1, 1]
    }
  }
})";

// The released MiniMax-M3 text config, in the released spelling.
json real_released() {
  json t = {
      {"vocab_size", 200064}, {"hidden_size", 6144}, {"num_hidden_layers", 60}, {"num_attention_heads", 64},
      {"num_key_value_heads", 4}, {"head_dim", 128}, {"rotary_dim", 64}, {"rope_theta", 5000000},
      {"partial_rotary_factor", 0.5}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 1048576},
      {"dense_intermediate_size", 12288}, {"intermediate_size", 3072}, {"shared_intermediate_size", 3072},
      {"n_shared_experts", 1}, {"num_local_experts", 128}, {"num_experts_per_tok", 4},
      {"routed_scaling_factor", 2.0}, {"swiglu_alpha", 1.702}, {"swiglu_limit", 7.0}, {"scoring_func", "sigmoid"},
      {"use_routing_bias", true}, {"tie_word_embeddings", false}};
  json freq = json::array();
  for (int l = 0; l < 60; ++l) freq.push_back(l < 3 ? 0 : 1);
  t["moe_layer_freq"] = freq;
  t["sparse_attention_config"] = {{"use_sparse_attention", true}, {"sparse_index_dim", 128},
                                  {"sparse_num_index_heads", 4},  {"sparse_topk_blocks", 16},
                                  {"sparse_block_size", 128},     {"sparse_score_type", "max"},
                                  {"sparse_init_block", 0},       {"sparse_local_block", 1},
                                  {"sparse_attention_freq", freq}, {"sparse_disable_index_value", freq}};
  return {{"model_type", "minimax_m3_vl"}, {"text_config", t}};
}

std::string error_of(const std::string& text) {
  try {
    parse_model_spec_json(text, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, TinyFixtureNormalizedSpelling) {
  ModelSpec s = parse_model_spec_json(fixture_config());
  EXPECT_EQ(s.vocab_size, 1024);
  EXPECT_EQ(s.hidden, 256);
  EXPECT_EQ(s.num_layers, 4);
  EXPECT_EQ(s.num_heads, 8);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.rotary_dim, 32);
  EXPECT_EQ(s.rope_theta, 5e6);
  EXPECT_EQ(s.rms_eps, 1e-6f);
  EXPECT_EQ(s.dense_inter, 256);
  EXPECT_EQ(s.moe_inter, 64);
  EXPECT_EQ(s.shared_inter, 64);
  EXPECT_EQ(s.num_experts, 16);
  EXPECT_EQ(s.top_k, 4);
  EXPECT_EQ(s.routed_scale, 2.0f);
  EXPECT_EQ(s.swiglu_alpha, 1.702f);
  EXPECT_EQ(s.swiglu_limit, 7.0f);
  EXPECT_EQ(s.index_heads, 2);
  EXPECT_EQ(s.index_dim, 64);
  EXPECT_EQ(s.index_block, 16);
  EXPECT_EQ(s.index_topk, 4);
  EXPECT_EQ(s.index_local, 1);
  EXPECT_EQ(s.max_positions, 4096);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  std::vector<AttnKind> attn{AttnKind::Full, AttnKind::Sparse, AttnKind::Sparse, AttnKind::Sparse};
  std::vector<MlpKind> mlp{MlpKind::Dense, MlpKind::MoE, MlpKind::MoE, MlpKind::MoE};
  EXPECT_EQ(s.attn, attn);
  EXPECT_EQ(s.mlp, mlp);
  // the tiny preset is the fixture's shape
  EXPECT_TRUE(s == synthetic_preset("tiny"));
}

TEST(Config, ReleasedSpellingGivesTheSameSpec) {
  ModelSpec norm = parse_model_spec_json(fixture_config());
  ModelSpec rel = parse_model_spec_json(kTinyReleased);
  EXPECT_TRUE(norm == rel);
  // a bare text config (no text_config nesting) too
  json j = json::parse(kTinyReleased);
  EXPECT_TRUE(parse_model_spec_json(j["text_config"].dump()) == norm);
  // both spellings in one file, agreeing: accepted
  json both = json::parse(fixture_config());
  json rel_t = json::parse(kTinyReleased)["text_config"];
  for (auto it = rel_t.begin(); it != rel_t.end(); ++it) both["text_config"][it.key()] = *it;
  EXPECT_TRUE(parse_model_spec_json(both.dump()) == norm);
}

TEST(Config, ReleasedRealConfig) {
  ModelSpec s = parse_model_spec_json(real_released().dump());
  ModelSpec want = synthetic_preset("real");
  EXPECT_TRUE(s == want);
  EXPECT_EQ(s.num_sparse_layers(), 57);
  EXPECT_EQ(s.num_moe_layers(), 57);
  EXPECT_FALSE(s.sparse(2));
  EXPECT_TRUE(s.sparse(3));
  EXPECT_EQ(s.group_size(), 16);
}

TEST(Config, IntegerFrequencies) {
  // An integer frequency reads as in DeepSeek-style configs: l >= first_k_dense_replace && l % k == 0.
  json j = real_released();
  j["text_config"]["moe_layer_freq"] = 1;
  j["text_config"]["sparse_attention_config"]["sparse_attention_freq"] = 1;
  j["text_config"]["first_k_dense_replace"] = 3;
  ModelSpec s = parse_model_spec_json(j.dump());
  EXPECT_TRUE(s == synthetic_preset("real"));
  j["text_config"]["moe_layer_freq"] = 2;
  s = parse_model_spec_json(j.dump());
  EXPECT_FALSE(s.moe(3));
  EXPECT_TRUE(s.moe(4));
  EXPECT_FALSE(s.moe(5));
  EXPECT_TRUE(s.sparse(5));
  // booleans in the per-layer lists
  j = json::parse(kTinyReleased);
  j["text_config"]["moe_layer_freq"] = {false, true, true, true};
  EXPECT_TRUE(parse_model_spec_json(j.dump()) == parse_model_spec_json(kTinyReleased));
  // use_sparse_attention = false with no plan: all layers full attention
  j = json::parse(kTinyReleased);
  j["text_config"]["sparse_attention_config"] = {{"use_sparse_attention", false}};
  s = parse_model_spec_json(j.dump());
  EXPECT_EQ(s.num_sparse_layers(), 0);
}

TEST(Config, EosList) {
  json j = json::parse(fixture_config());
  j["text_config"]["eos_token_id"] = {200020, 2};
  EXPECT_EQ(parse_model_spec_json(j.dump()).eos_id, 200020);
}

TEST(Config, WriterRoundTrips) {
  for (const auto& name : synthetic_preset_names()) {
    ModelSpec s = synthetic_preset(name);
    for (auto sp : {ConfigSpelling::Released, ConfigSpelling::Normalized})
      for (bool nested : {true, false}) {
        std::string text = model_spec_to_json(s, sp, nested);
        EXPECT_TRUE(parse_model_spec_json(text) == s) << name << " spelling " << int(sp) << " nested " << nested;
        json j = json::parse(text);
        const json& t = nested ? j["text_config"] : j;
        if (sp == ConfigSpelling::Released) {
          EXPECT_TRUE(t.contains("sparse_attention_config") && t.contains("moe_layer_freq"));
          EXPECT_FALSE(t.contains("layer_types") || t.contains("index_n_heads"));
        } else {
          EXPECT_TRUE(t.contains("layer_types") && t.contains("rope_parameters"));
          EXPECT_FALSE(t.contains("sparse_attention_config") || t.contains("moe_layer_freq"));
        }
      }
  }
}

struct RejectCase {
  const char* what;
  std::function<void(json& t)> mutate;  // applied to the fixture's text_config
  std::vector<const char*> expect;      // substrings of the message
};

TEST(Config, Rejections) {
  const json base = json::parse(fixture_config());
  const json rel = json::parse(kTinyReleased);
  std::vector<RejectCase> cases = {
      {"missing hidden_size", [](json& t) { t.erase("hidden_size"); }, {"text_config.hidden_size", "missing"}},
      {"string size", [](json& t) { t["hidden_size"] = "256"; }, {"text_config.hidden_size", "integer", "\"256\""}},
      {"float size", [](json& t) { t["vocab_size"] = 1024.5; }, {"text_config.vocab_size", "integer", "1024.5"}},
      {"negative size", [](json& t) { t["hidden_size"] = -256; }, {"hidden_size", "> 0", "-256"}},
      {"zero vocab", [](json& t) { t["vocab_size"] = 0; }, {"vocab_size", "> 0", "got 0"}},
      {"zero layers", [](json& t) { t["num_hidden_layers"] = 0; }, {"num_hidden_layers", "got 0"}},
      {"too many layers", [](json& t) { t["num_hidden_layers"] = 100000; }, {"num_hidden_layers", "100000"}},
      {"absurd experts", [](json& t) { t["num_local_experts"] = 1 << 30; t["num_experts_per_tok"] = 1; },
       {"num_local_experts", "1073741824", "sanity limit"}},
      {"absurd heads", [](json& t) { t["num_attention_heads"] = 1 << 20; }, {"num_attention_heads", "sanity limit"}},
      {"huge", [](json& t) { t["num_hidden_layers"] = int64_t(1) << 40; }, {"num_hidden_layers", "out of range"}},
      {"zero head_dim", [](json& t) { t["head_dim"] = 0; t["rope_parameters"].erase("partial_rotary_factor"); },
       {"head_dim", "got 0"}},
      {"heads not divisible", [](json& t) { t["num_key_value_heads"] = 3; },
       {"num_attention_heads (8)", "num_key_value_heads (3)", "divisible"}},
      {"index heads != kv heads", [](json& t) { t["index_n_heads"] = 4; },
       {"index_n_heads", "= 4", "num_key_value_heads = 2"}},
      {"odd rotary", [](json& t) { t["rotary_dim"] = 31; t["rope_parameters"].erase("partial_rotary_factor"); },
       {"rotary_dim", "even", "31"}},
      {"rotary > head_dim", [](json& t) { t["rotary_dim"] = 128; t["rope_parameters"].erase("partial_rotary_factor"); },
       {"rotary_dim (128)", "head_dim (64)"}},
      {"rotary vs factor", [](json& t) { t["rotary_dim"] = 16; },
       {"rotary_dim", "16", "partial_rotary_factor", "0.5"}},
      {"factor not whole", [](json& t) { t.erase("rotary_dim"); t["rope_parameters"]["partial_rotary_factor"] = 0.3; },
       {"partial_rotary_factor", "0.3", "whole number"}},
      {"no rotary", [](json& t) { t.erase("rotary_dim"); t["rope_parameters"].erase("partial_rotary_factor"); },
       {"rotary_dim", "missing"}},
      {"no theta", [](json& t) { t["rope_parameters"].erase("rope_theta"); }, {"rope_theta", "missing"}},
      {"theta disagree", [](json& t) { t["rope_theta"] = 10000.0; }, {"rope_theta", "10000", "disagrees"}},
      {"rope type", [](json& t) { t["rope_parameters"]["rope_type"] = "yarn"; }, {"rope_parameters.rope_type", "yarn"}},
      {"rope scaling", [](json& t) { t["rope_scaling"] = {{"type", "linear"}, {"factor", 2}}; }, {"rope_scaling"}},
      {"top_k > experts", [](json& t) { t["num_experts_per_tok"] = 17; },
       {"num_experts_per_tok (17)", "num_local_experts (16)"}},
      {"no experts", [](json& t) { t.erase("num_local_experts"); }, {"num_local_experts", "missing"}},
      {"no dense width", [](json& t) { t.erase("dense_intermediate_size"); }, {"dense_intermediate_size", "missing"}},
      {"layer list length", [](json& t) { t["layer_types"].erase(3); }, {"layer_types", "3 entries", "is 4"}},
      {"mlp list length", [](json& t) { t["mlp_layer_types"].push_back("dense"); }, {"mlp_layer_types", "5 entries"}},
      {"unknown layer type", [](json& t) { t["layer_types"][2] = "sliding_attention"; },
       {"layer_types[2]", "sliding_attention"}},
      {"unknown mlp type", [](json& t) { t["mlp_layer_types"][1] = "moe"; }, {"mlp_layer_types[1]", "\"moe\""}},
      {"layer type not string", [](json& t) { t["layer_types"][0] = 1; }, {"layer_types[0]", "string"}},
      {"no attention plan", [](json& t) { t.erase("layer_types"); }, {"layer plan", "layer_types"}},
      {"no mlp plan", [](json& t) { t.erase("mlp_layer_types"); }, {"layer plan", "moe_layer_freq"}},
      {"plans disagree", [](json& t) { t["sparse_attention_config"] = {{"sparse_attention_freq", {0, 1, 0, 1}}}; },
       {"layer_types", "sparse_attention_freq", "layer 2"}},
      {"freq value", [](json& t) { t.erase("mlp_layer_types"); t["moe_layer_freq"] = {0, 1, 2, 1}; },
       {"moe_layer_freq[2]", "2"}},
      {"freq zero", [](json& t) { t.erase("mlp_layer_types"); t["moe_layer_freq"] = 0; }, {"moe_layer_freq", ">= 1"}},
      {"freq type", [](json& t) { t.erase("mlp_layer_types"); t["moe_layer_freq"] = "all"; }, {"moe_layer_freq"}},
      {"index conflict", [](json& t) { t["sparse_attention_config"] = {{"sparse_num_index_heads", 4}}; },
       {"sparse_num_index_heads", "= 4", "index_n_heads", "= 2"}},
      {"zero block", [](json& t) { t["index_block_size"] = 0; }, {"index_block_size", "got 0"}},
      {"no block", [](json& t) { t.erase("index_block_size"); }, {"index_block_size", "missing"}},
      {"local > topk", [](json& t) { t["index_local_blocks"] = 5; }, {"index_local_blocks", "= 5"}},
      {"rotary > index dim", [](json& t) { t["index_head_dim"] = 16; }, {"rotary_dim (32)", "index_head_dim", "(16)"}},
      {"init block", [](json& t) { t["sparse_attention_config"] = {{"sparse_init_block", 1}}; },
       {"sparse_init_block", "= 1"}},
      {"score type", [](json& t) { t["sparse_attention_config"] = {{"sparse_score_type", "mean"}}; },
       {"sparse_score_type", "mean"}},
      {"sparse off but sparse layers", [](json& t) { t["sparse_attention_config"] = {{"use_sparse_attention", false}}; },
       {"use_sparse_attention", "layer 1"}},
      {"shared experts", [](json& t) { t["n_shared_experts"] = 2; }, {"n_shared_experts", "= 2"}},
      {"scoring", [](json& t) { t["scoring_func"] = "softmax"; }, {"scoring_func", "softmax"}},
      {"tied", [](json& t) { t["tie_word_embeddings"] = true; }, {"tie_word_embeddings", "true"}},
      {"eps type", [](json& t) { t["rms_norm_eps"] = "small"; }, {"rms_norm_eps", "number", "\"small\""}},
      {"eps zero", [](json& t) { t["rms_norm_eps"] = 0; }, {"rms_norm_eps", "> 0"}},
      {"eps beyond float", [](json& t) { t["rms_norm_eps"] = 1e300; }, {"rms_norm_eps", "1e+300", "finite float"}},
      {"limit", [](json& t) { t["swiglu_limit"] = -1; }, {"swiglu_limit", "-1"}},
      {"routed scale", [](json& t) { t["routed_scaling_factor"] = 0; }, {"routed_scaling_factor", "> 0"}},
      {"sparse cfg type", [](json& t) { t["sparse_attention_config"] = 3; }, {"sparse_attention_config", "object"}},
      {"bool type", [](json& t) { t["use_qk_norm"] = "yes"; }, {"use_qk_norm", "true or false"}},
  };
  for (const auto& c : cases) {
    json j = base;
    c.mutate(j["text_config"]);
    std::string msg = error_of(j.dump());
    ASSERT_FALSE(msg.empty()) << c.what << ": accepted";
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << c.what << ": " << msg;
    for (const char* want : c.expect) EXPECT_NE(msg.find(want), std::string::npos) << c.what << ": " << msg;
  }
  // released-spelling specific
  {
    json j = rel;
    j["text_config"]["sparse_attention_config"].erase("sparse_block_size");
    std::string msg = error_of(j.dump());
    EXPECT_NE(msg.find("sparse_attention_config.sparse_block_size"), std::string::npos) << msg;
    j = rel;
    j["text_config"]["sparse_attention_config"]["sparse_attention_freq"] = {0, 1, 1};
    msg = error_of(j.dump());
    EXPECT_NE(msg.find("sparse_attention_freq"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 entries"), std::string::npos) << msg;
    j = rel;
    j["text_config"]["sparse_attention_config"]["sparse_num_index_heads"] = 1;
    msg = error_of(j.dump());
    EXPECT_NE(msg.find("sparse_num_index_heads) = 1"), std::string::npos) << msg;
  }
  // whole-document errors
  EXPECT_NE(error_of("{\"text_config\": ").find("invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"text_config\": [1]}").find("text_config"), std::string::npos);
  EXPECT_NE(error_of("{}").find("vocab_size"), std::string::npos);
  // nested past any stack (the message used to dump it whole, recursively): shown briefly
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(error_of(deep).find("JSON object, got [[[[[...]]]]]"), std::string::npos);
  EXPECT_NE(error_of("{\"text_config\": {\"vocab_size\": " + deep + "}}").find("[[[[...]]]]"), std::string::npos);
}

TEST(Config, ValidateNamesField) {
  ModelSpec s = synthetic_preset("tiny");
  s.top_k = 99;
  try {
    s.validate();
    FAIL() << "accepted top_k 99";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok (99)"), std::string::npos) << e.what();
  }
  s = synthetic_preset("tiny");
  s.attn.pop_back();
  EXPECT_THROW(s.validate(), Error);
}

TEST(Config, LoadModelSpecFromDirAndFile) {
  std::string dir = std::string(M3_TEST_DATA) + "/tiny-m3-a";
  EXPECT_TRUE(load_model_spec(dir) == load_model_spec(dir + "/config.json"));
  try {
    load_model_spec(dir + "/no-such-dir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir"), std::string::npos) << e.what();
  }
}
