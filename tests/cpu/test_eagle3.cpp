// EAGLE3 drafts (model/eagle3_spec.h, ref/eagle3.h, runtime/drafter.h) on the CPU reference:
//   - the draft's config: every refusal names its field;
//   - the draft model against a naive double-precision implementation written from the formula in
//     ref/eagle3.h (the library keeps fp32 intermediates), own and shared lm_head, d2t;
//   - the target's auxiliary hidden states (StepBatch::aux_layers): the embedding at layer 0, what
//     the final norm and lm_head turn into the logits at layer L, the same bits in a prefill and a
//     decode step, and the refusals;
//   - greedy outputs with EAGLE3 drafts identical to plain decoding (generate and the scheduler,
//     batched, with a tight cache that preempts), the drafter's sequences all released;
//   - the greedy choice over a draft vocabulary (eagle3_greedy: what the GPU draft uses) equal to
//     the argmax over the target vocabulary the reference builds, ties and NaN included;
//   - the drafter's bookkeeping under mixed acceptance: the drafts it proposes after any path of
//     verify steps equal those of a fresh drafter that observed the same history in one pass.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/recording_drafter.h"
#include "common/temp_dir.h"
#include "common/tiny_reference.h"
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/codecs.h"
#include "model/config.h"
#include "model/load_weights.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/synthetic_eagle3.h"
#include "ref/eagle3.h"
#include "ref/golden.h"
#include "ref/linear.h"
#include "ref/norm.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"

using namespace m3;
namespace fs = std::filesystem;

namespace {

struct Draft {
  std::shared_ptr<test::TempDir> tmp = std::make_shared<test::TempDir>();  // removed with the last copy
  fs::path dir = tmp->path;
  std::shared_ptr<ref::Eagle3Model> model;
};

// A synthetic draft for the tiny reference model, its shared tensors from the tiny model's weights.
Draft make_draft(bool reduced, uint64_t seed, int threads = 2, std::vector<int> aux_layers = {}) {
  const auto& t = test::tiny();
  Draft d;
  SyntheticEagle3Options o;
  o.seed = seed;
  o.reduced_vocab = reduced;
  o.aux_layers = std::move(aux_layers);
  write_synthetic_eagle3(d.dir, t.spec, o);
  Eagle3Spec s = load_eagle3_spec(d.dir, t.spec);
  const auto src = make_weight_source(t.weights);
  Eagle3Weights w = load_eagle3_weights(d.dir, s, src.get());
  d.model = std::make_shared<ref::Eagle3Model>(std::move(s), std::move(w), threads);
  return d;
}

// ---- the naive draft: doubles throughout, loops as the formula reads ----
struct NaiveDraft {
  const Eagle3Spec& s;
  const Eagle3Weights& w;
  std::vector<std::vector<double>> K, V;  // per position: kv_dim

  std::vector<double> mv(const Mat& m, const std::vector<double>& x) const {
    std::vector<double> y(size_t(m.rows));
    for (int o = 0; o < m.rows; ++o) {
      double acc = 0;
      for (int i = 0; i < m.cols; ++i) acc += double(m.row(o)[i]) * x[size_t(i)];
      y[size_t(o)] = acc;
    }
    return y;
  }
  std::vector<double> rms(const std::vector<double>& x, const Vec& g) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1 / std::sqrt(ss / double(x.size()) + double(s.rms_eps));
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(g[i]);
    return y;
  }
  void rope(std::vector<double>& x, int heads, int pos) const {
    const int hd = s.head_dim;
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < hd / 2; ++j) {
        const double f = std::pow(s.rope_theta, -2.0 * j / hd), a = pos * f;
        const double x1 = x[size_t(h * hd + j)], x2 = x[size_t(h * hd + j + hd / 2)];
        x[size_t(h * hd + j)] = x1 * std::cos(a) - x2 * std::sin(a);
        x[size_t(h * hd + j + hd / 2)] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  }
  // One row at position pos (== K.size()): returns the pre-norm output; logits when asked.
  // from_target: hid holds the target's aux states (through fc), else the previous row's output.
  std::vector<double> row(int32_t tok, const std::vector<double>& hid, bool from_target, std::vector<double>* logits) {
    const int H = s.hidden, hd = s.head_dim;
    std::vector<double> h = from_target ? mv(w.fc, hid) : hid;
    std::vector<double> e(w.embed.row(tok), w.embed.row(tok) + H);
    std::vector<double> a = rms(e, w.input_norm), g = rms(h, w.hidden_norm);
    std::vector<double> r = s.norm_before_residual ? g : h;
    a.insert(a.end(), g.begin(), g.end());
    std::vector<double> q = mv(w.wq, a), k = mv(w.wk, a), v = mv(w.wv, a);
    const int pos = int(K.size());
    rope(q, s.num_heads, pos);
    rope(k, s.num_kv_heads, pos);
    K.push_back(k);
    V.push_back(v);
    std::vector<double> o(size_t(s.q_dim()), 0.0);
    for (int hh = 0; hh < s.num_heads; ++hh) {
      const int g2 = hh / (s.num_heads / s.num_kv_heads);
      std::vector<double> sc(K.size());
      double mx = -1e300;
      for (size_t j = 0; j < K.size(); ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += q[size_t(hh * hd + i)] * K[j][size_t(g2 * hd + i)];
        sc[j] = d / std::sqrt(double(hd));
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (double& x : sc) z += (x = std::exp(x - mx));
      for (size_t j = 0; j < K.size(); ++j)
        for (int i = 0; i < hd; ++i) o[size_t(hh * hd + i)] += sc[j] / z * V[j][size_t(g2 * hd + i)];
    }
    const std::vector<double> y = mv(w.wo, o);
    for (int i = 0; i < H; ++i) r[size_t(i)] += y[size_t(i)];
    const std::vector<double> zz = rms(r, w.post_norm);
    std::vector<double> gt = mv(w.gate, zz);
    const std::vector<double> up = mv(w.up, zz);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
    const std::vector<double> m = mv(w.down, gt);
    for (int i = 0; i < H; ++i) r[size_t(i)] += m[size_t(i)];
    if (logits) {
      const std::vector<double> dl = mv(w.lm_head, rms(r, w.norm));
      logits->assign(size_t(s.vocab), -INFINITY);
      for (int i = 0; i < w.lm_head.rows; ++i) (*logits)[size_t(i + (w.d2t.empty() ? 0 : w.d2t[size_t(i)]))] = dl[size_t(i)];
    }
    return r;
  }
};

// n random tokens and n rows of the target's (fc_in wide) hidden states, drawn from rng.
struct RandomRows {
  std::vector<int32_t> tokens;
  std::vector<float> aux;
};
RandomRows random_rows(std::mt19937& rng, const Eagle3Spec& s, int n) {
  RandomRows r;
  r.tokens.resize(static_cast<size_t>(n));
  for (auto& t : r.tokens) t = int32_t(rng() % uint32_t(s.vocab));
  std::normal_distribution<float> nd(0, 2);
  r.aux.resize(size_t(n) * s.fc_in());
  for (auto& x : r.aux) x = nd(rng);
  return r;
}

// max |got - want| over max |want| of the finite entries; the positions of -inf must agree.
double rel_diff(const std::vector<float>& got, const std::vector<double>& want, size_t* worst) {
  EXPECT_EQ(got.size(), want.size());
  double m = 0, d = 0;
  *worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << "entry " << i << " should be -inf (no draft id maps there)";
      continue;
    }
    EXPECT_TRUE(std::isfinite(got[i])) << "entry " << i;
    m = std::max(m, std::abs(want[i]));
    if (std::abs(double(got[i]) - want[i]) > d) d = std::abs(double(got[i]) - want[i]), *worst = i;
  }
  return d / std::max(m, 1e-30);
}

}  // namespace

TEST(Eagle3, ConfigRefusalsNameTheField) {
  const ModelSpec& t = test::tiny().spec;
  const test::TempDir tmp;
  const fs::path d = tmp.path;
  const Eagle3Spec good = synthetic_eagle3_spec(t);
  auto expect_error = [&](const std::string& edit_from, const std::string& edit_to, const std::string& words) {
    std::string j = eagle3_spec_to_json(good);
    const size_t at = j.find(edit_from);
    ASSERT_NE(at, std::string::npos) << edit_from;
    j.replace(at, edit_from.size(), edit_to);
    std::ofstream(d / "config.json") << j;
    try {
      load_eagle3_spec(d, t);
      ADD_FAILURE() << "accepted: " << edit_to;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error("\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2", "num_hidden_layers 2");
  expect_error("\"LlamaForCausalLMEagle3\"", "\"LlamaForCausalLM\"", "architectures");
  expect_error("\"hidden_size\": 256", "\"hidden_size\": -4", "hidden_size");
  expect_error("\"target_hidden_size\": 256", "\"target_hidden_size\": 128", "target_hidden_size 128");
  expect_error("\"vocab_size\": 1024", "\"vocab_size\": 1000", "vocab_size 1000");
  expect_error("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "num_key_value_heads 3");
  expect_error("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act");
  expect_error("\"use_aux_hidden_state\": true", "\"use_aux_hidden_state\": false", "use_aux_hidden_state");
  expect_error("\"rms_norm_eps\"", "\"rope_scaling\": {\"rope_type\": \"yarn\"}, \"rms_norm_eps\"", "yarn");
  std::ofstream(d / "config.json") << "{\"hidden_size\": 256,";
  EXPECT_THROW(load_eagle3_spec(d, t), Error);
  // aux layer ids: out of range and repeated
  for (const auto& [ids, words] : std::vector<std::pair<std::string, std::string>>{
           {"[1, 9]", "outside the target's layers"}, {"[2, 2]", "twice"}, {"[]", "non-empty"}}) {
    nlohmann::json cj = nlohmann::json::parse(eagle3_spec_to_json(good));
    cj["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = nlohmann::json::parse(ids);
    std::ofstream(d / "config.json") << cj.dump();
    try {
      load_eagle3_spec(d, t);
      ADD_FAILURE() << "accepted aux layers " << ids;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
  // round trip
  std::ofstream(d / "config.json") << eagle3_spec_to_json(good);
  const Eagle3Spec back = load_eagle3_spec(d, t);
  EXPECT_EQ(back.aux_layers, good.aux_layers);
  EXPECT_EQ(back.q_dim(), good.q_dim());
  EXPECT_EQ(back.rms_eps, good.rms_eps);
}

TEST(Eagle3, LoadedTensorsAreTheFilesValues) {
  const Draft d = make_draft(true, 11);
  const SafetensorsSet f = SafetensorsSet::open(d.dir);
  const auto& w = d.model->weights();
  for (const auto& [name, m] : std::vector<std::pair<std::string, const Mat*>>{
           {"fc.weight", &w.fc}, {"midlayer.self_attn.k_proj.weight", &w.wk}, {"lm_head.weight", &w.lm_head}}) {
    const TensorView& t = f.get(name);
    ASSERT_EQ(size_t(t.numel()), m->data.size()) << name;
    for (size_t i = 0; i < m->data.size(); i += 7) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      ASSERT_EQ(bf16_to_f32(h), m->data[i]) << name << " element " << i;
    }
  }
  ASSERT_EQ(int(w.d2t.size()), d.model->spec().draft_vocab);
  for (int i = 0; i < d.model->spec().draft_vocab; ++i) ASSERT_EQ(i + w.d2t[size_t(i)], 2 * i);
  // the shared draft takes the target's embedding and lm_head
  const Draft s = make_draft(false, 12);
  EXPECT_FALSE(s.model->weights().own_lm_head);
  EXPECT_EQ(s.model->weights().lm_head.data, test::tiny().weights.lm_head.data);
  EXPECT_EQ(s.model->weights().embed.data, test::tiny().weights.embed.data);
  // a missing tensor is named
  const test::TempDir broken_dir;
  const fs::path broken = broken_dir.path;
  {
    SafetensorsWriter wr;
    wr.add("fc.weight", DType::BF16, {1, 1}, std::vector<uint8_t>{0, 0});
    wr.write(broken / "model.safetensors");
  }
  try {
    load_eagle3_weights(broken, d.model->spec(), nullptr);
    ADD_FAILURE() << "a draft with a wrong fc shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight"), std::string::npos) << e.what();
  }
}

// The library's rows (pre-norm outputs of every row, logits of the last) against the naive draft,
// over an observe-like pass of n rows from the target's hidden states, then three draft rows of one
// token each from the previous pre-norm output, as a drafter runs it.
TEST(Eagle3, ModelMatchesANaiveImplementation) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // shared and own lm_head; and one aux layer (fc then maps hidden to hidden: the rows must still
  // go through it)
  for (int variant : {0, 1, 2}) {
    const bool reduced = variant == 1;
    const Draft d = make_draft(reduced, seed % 1000 + 1, 2, variant == 2 ? std::vector<int>{2} : std::vector<int>{});
    const Eagle3Spec& s = d.model->spec();
    if (variant == 2) ASSERT_EQ(s.fc_in(), s.hidden);
    NaiveDraft nv{s, d.model->weights(), {}, {}};
    const int n = 3 + int(rng() % 20);
    const auto [toks, aux] = random_rows(rng, s, n);
    ref::Eagle3Cache c;
    std::vector<float> logits(7, NAN);  // poisoned: must be replaced whole
    std::vector<float> r = d.model->forward(c, 0, toks, aux.data(), ref::Eagle3Model::Input::TargetAux, &logits);
    std::vector<double> want_logits, want_r;
    for (int i = 0; i < n; ++i) {
      const std::vector<double> hid(aux.begin() + size_t(i) * s.fc_in(), aux.begin() + size_t(i + 1) * s.fc_in());
      const std::vector<double> ri = nv.row(toks[size_t(i)], hid, true, i == n - 1 ? &want_logits : nullptr);
      want_r.insert(want_r.end(), ri.begin(), ri.end());
    }
    size_t worst;
    double e = rel_diff(r, want_r, &worst);
    // fp32 intermediates (products summed in double) through two norms, attention and the MLP:
    // a few float roundings of relative size 6e-8 each; 1e-5 leaves room and catches any wrong term
    EXPECT_LT(e, 1e-5) << "variant " << variant << " pre-norm rows: worst element " << worst;
    e = rel_diff(logits, want_logits, &worst);
    EXPECT_LT(e, 1e-5) << "logits: worst element " << worst;
    c.len = n;
    std::vector<float> h(r.end() - s.hidden, r.end());
    std::vector<double> hd(want_r.end() - s.hidden, want_r.end());
    for (int k = 0; k < 3; ++k) {
      const int32_t t = int32_t(rng() % uint32_t(s.vocab));
      c.len = n + k;
      h = d.model->forward(c, n + k, std::span<const int32_t>(&t, 1), h.data(), ref::Eagle3Model::Input::DraftPrenorm,
                           &logits);
      hd = nv.row(t, hd, false, &want_logits);
      e = rel_diff(h, hd, &worst);
      EXPECT_LT(e, 1e-5) << "draft row " << k << ": worst element " << worst;
      e = rel_diff(logits, want_logits, &worst);
      EXPECT_LT(e, 1e-5) << "draft row " << k << " logits: worst element " << worst;
    }
  }
}

// propose(): draft 1 is the argmax of the last observed row's logits, draft i + 1 that of a row at
// the next position whose token is draft i and whose hidden is the row before's pre-norm output
// (the naive draft in doubles says which token; a near-tie in its logits is reported, not compared).
TEST(Eagle3, ProposeIsGreedyDraftingOfTheModel) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Draft d = make_draft(true, seed % 883 + 1);
  const Eagle3Spec& s = d.model->spec();
  int compared = 0;
  for (int rep = 0; rep < 4; ++rep) {
    NaiveDraft nv{s, d.model->weights(), {}, {}};
    const int n = 2 + int(rng() % 12);
    const auto [next, aux] = random_rows(rng, s, n);
    ref::Eagle3Drafter dr(d.model);
    dr.observe(3, 0, next, aux.data());
    const std::vector<int32_t> got = dr.propose(3, 3);
    ASSERT_EQ(got.size(), 3u);
    std::vector<double> logits, h;
    for (int i = 0; i < n; ++i)
      h = nv.row(next[size_t(i)], std::vector<double>(aux.begin() + size_t(i) * s.fc_in(), aux.begin() + size_t(i + 1) * s.fc_in()),
                 true, i == n - 1 ? &logits : nullptr);
    for (int k = 0; k < 3; ++k) {
      std::vector<double> sorted = logits;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const int32_t want = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (sorted[0] - sorted[1] < 1e-4 * std::abs(sorted[0])) {
        std::printf("  [eagle3 propose] near-tie at draft %d (gap %.3g): not compared\n", k, sorted[0] - sorted[1]);
        break;
      }
      ASSERT_EQ(got[size_t(k)], want) << "draft " << k << " of repetition " << rep;
      ++compared;
      h = nv.row(want, h, false, &logits);
    }
    EXPECT_EQ(dr.propose(3, 2), std::vector<int32_t>(got.begin(), got.begin() + 2)) << "a second propose differs";
  }
  EXPECT_GE(compared, 8) << "too few drafts compared";
}

TEST(Eagle3, AuxRowsAreTheResidualStream) {
  const auto& t = test::tiny();
  const ModelSpec& s = t.spec;
  const int H = s.hidden, L = s.num_layers;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(static_cast<size_t>(5 + rng() % 40));
  for (auto& x : prompt) x = int32_t(rng() % uint32_t(s.vocab_size));
  const int n = int(prompt.size());
  auto backend = t.backend(16);
  StepBatch b;
  b.seqs.push_back(SeqStep{0, prompt, {0, 1, 2, 3}, true});
  b.seqs[0].want_aux = true;
  b.aux_layers = {L, 0, 1, L - 1};
  const StepOutput o = backend->step(b);
  ASSERT_EQ(o.aux_width, 4 * H);
  ASSERT_EQ(o.aux.size(), size_t(n) * 4 * H);
  ASSERT_EQ(o.aux_first_row, std::vector<int>{0});
  ThreadPool pool(2);
  for (int i = 0; i < n; ++i) {
    const float* a = o.aux_row(0, i);
    for (int j = 0; j < H; ++j)  // layer 0: the embedding row
      ASSERT_EQ(a[H + j], t.weights.embed.row(prompt[size_t(i)])[j]) << "token " << i << " element " << j;
    std::vector<float> xn(static_cast<size_t>(H)), lg(static_cast<size_t>(s.vocab_size));
    ref::gemma_rms_norm(a, t.weights.final_norm.data(), H, s.rms_eps, xn.data());
    ref::linear(t.weights.lm_head, xn.data(), H, 1, lg.data(), s.vocab_size, pool);
    for (int v = 0; v < s.vocab_size; ++v)  // layer L: what the final norm and lm_head read
      ASSERT_EQ(lg[size_t(v)], o.row(0, i)[v]) << "token " << i << " logit " << v;
  }
  // the same rows when the last token comes in a decode step beside another sequence
  auto b2 = t.backend(16);
  StepBatch pre;
  pre.seqs.push_back(SeqStep{0, std::vector<int32_t>(prompt.begin(), prompt.end() - 1), {5, 6, 7, 8}, false});
  b2->step(pre);
  StepBatch dec;
  dec.seqs.push_back(SeqStep{0, {7, 7, 7}, {0}, false});
  dec.seqs.push_back(SeqStep{n - 1, {prompt.back()}, {5, 6, 7, 8}, false});
  dec.seqs[1].want_aux = true;
  dec.aux_layers = b.aux_layers;
  const StepOutput od = b2->step(dec);
  ASSERT_EQ(od.aux_first_row, (std::vector<int>{-1, 0}));
  for (int j = 0; j < 4 * H; ++j) ASSERT_EQ(od.aux_row(1)[j], o.aux_row(0, n - 1)[j]) << "element " << j;
  // refusals
  auto refused = [&](StepBatch bad, const std::string& words) {
    try {
      t.backend(16)->step(bad);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  StepBatch bad = b;
  bad.aux_layers = {L + 1};
  refused(bad, fmt::format("aux_layers[0] = {}", L + 1));
  bad.aux_layers = {1, 2, 1};
  refused(bad, "lists layer 1 twice");
  bad.aux_layers.clear();
  refused(bad, "aux_layers is empty");
}

namespace {

std::vector<int32_t> random_prompt(std::mt19937& rng, int vocab) {
  std::vector<int32_t> p(static_cast<size_t>(4 + rng() % 30));
  for (auto& x : p) x = int32_t(rng() % uint32_t(vocab));
  if (rng() % 2) {  // a repeated pattern (greedy tiny models like to repeat too)
    const std::vector<int32_t> pat(p.begin(), p.begin() + 3);
    for (int k = 0; k < 4; ++k) p.insert(p.end(), pat.begin(), pat.end());
  }
  return p;
}

// n greedy requests (ignore_eos) of random prompts and max_tokens in [base, base + span).
std::vector<GenerationRequest> random_requests(std::mt19937& rng, int n, int base, int span) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt = random_prompt(rng, test::tiny().spec.vocab_size);
    r.max_tokens = base + int(rng() % unsigned(span));
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct SchedRun {
  std::vector<std::vector<int32_t>> tokens;
  StepReport sum;
  int free_after = 0;
  int drafter_failures = 0;
  std::string last_drafter_error;
};

SchedRun run_scheduler(const std::vector<GenerationRequest>& reqs, SchedulerOptions o, int blocks) {
  auto backend = test::tiny().backend(blocks);
  Scheduler s(*backend, o);
  SchedRun out;
  out.tokens.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    s.add(i, reqs[i], [&out, i](const RequestEvent& e) {
      EXPECT_NE(e.reason, FinishReason::Error) << "request " << i << ": " << e.error;
      out.tokens[i].insert(out.tokens[i].end(), e.new_tokens.begin(), e.new_tokens.end());
    });
  for (int steps = 0; s.has_work() && steps < 5000; ++steps) {
    const StepReport r = s.step();
    out.sum.verify_rows += r.verify_rows;
    out.sum.drafted += r.drafted;
    out.sum.accepted += r.accepted;
    out.sum.preempted += r.preempted;
  }
  EXPECT_FALSE(s.has_work());
  out.free_after = s.blocks().num_free();
  out.drafter_failures = s.drafter_failures();
  out.last_drafter_error = s.last_drafter_error();
  return out;
}

}  // namespace

TEST(Eagle3, GreedyOutputsEqualPlainDecoding) {
  const auto& t = test::tiny();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (bool reduced : {false, true}) {
    const Draft d = make_draft(reduced, seed % 997 + 1);
    auto drafter = std::make_shared<ref::Eagle3Drafter>(d.model);
    // generate(): one request, greedy and sampled (sampled: the draws of the acceptance differ from
    // plain sampling, so only that it runs and keeps within max_tokens is checked)
    for (int i = 0; i < 3; ++i) {
      GenerateRequest r;
      r.prompt = random_prompt(rng, t.spec.vocab_size);
      r.max_tokens = 10 + int(rng() % 20);
      auto b = t.backend(16);
      const std::vector<int32_t> want = generate(*b, r).ids;
      r.speculative.method = SpeculativeMethod::Eagle3;
      r.speculative.drafter = drafter;
      r.speculative.num_draft_tokens = 1 + int(rng() % 3);
      auto b2 = t.backend(16);
      const GenerateResult got = generate(*b2, r);
      EXPECT_EQ(got.ids, want) << "prompt " << i << (reduced ? " (reduced vocabulary draft)" : "");
      EXPECT_GT(got.verify_steps, 0);
      EXPECT_EQ(drafter->sequences(), 0u) << "generate left the drafter's sequence behind";
      r.sampling.temperature = 0.8f;
      auto b3 = t.backend(16);
      EXPECT_EQ(int(generate(*b3, r).ids.size()), r.max_tokens);
    }
    // the scheduler: a batch of greedy and sampled requests; then a cache that must preempt
    std::vector<GenerationRequest> reqs = random_requests(rng, 6, 8, 24);
    reqs[4].sampling = SamplingParams{0.7f, 0, 1.0f, 99};  // sampled: decodes one token a step
    SchedulerOptions plain;
    plain.max_num_seqs = 4;
    const SchedRun want = run_scheduler(reqs, plain, 64);
    SchedulerOptions spec = plain;
    spec.speculative.method = SpeculativeMethod::Eagle3;
    spec.speculative.drafter = drafter;
    const SchedRun got = run_scheduler(reqs, spec, 64);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i;
    EXPECT_GT(got.sum.verify_rows, 0);
    EXPECT_EQ(got.free_after, 64);
    EXPECT_EQ(drafter->sequences(), 0u) << "finished requests left drafter state";
    // four short prompts (one block of 16 each) growing to 3 blocks in a cache of 6: preemptions
    std::vector<GenerationRequest> grow;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r;
      for (int k = 0, n = 3 + int(rng() % 10); k < n; ++k) r.prompt.push_back(int32_t(rng() % 1024u));
      r.max_tokens = 34;
      r.ignore_eos = true;
      grow.push_back(std::move(r));
    }
    const SchedRun grow_plain = run_scheduler(grow, plain, 64);
    const SchedRun tight = run_scheduler(grow, spec, 6);
    EXPECT_GT(tight.sum.preempted, 0) << "the tight cache did not preempt: the case is not exercised";
    for (size_t i = 0; i < grow.size(); ++i)
      EXPECT_EQ(tight.tokens[i], grow_plain.tokens[i]) << "request " << i << " (tight)";
    EXPECT_EQ(tight.free_after, 6);
    EXPECT_EQ(drafter->sequences(), 0u);
  }
}

// The drafts a sequence gets depend on its kept history only: whatever verify steps led there
// (drafts kept or rejected, runs of 1 .. k + 1 tokens observed), a fresh drafter that observes the
// same tokens in one pass (aux rows from one prefill of them) proposes the same drafts, bitwise.
TEST(Eagle3, DraftsDependOnTheKeptHistoryOnly) {
  const auto& t = test::tiny();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Draft d = make_draft(false, seed % 991 + 1);
  const std::vector<GenerationRequest> reqs = random_requests(rng, 4, 12, 12);
  SchedulerOptions plain;
  plain.max_num_seqs = 3;
  const SchedRun want = run_scheduler(reqs, plain, 64);
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < reqs.size(); ++i) {
    full.push_back(reqs[i].prompt);
    full.back().insert(full.back().end(), want.tokens[i].begin(), want.tokens[i].end());
  }
  auto rec = std::make_shared<test::RecordingDrafter>(std::make_shared<ref::Eagle3Drafter>(d.model), full, seed);
  SchedulerOptions spec = plain;
  spec.speculative.method = SpeculativeMethod::Eagle3;
  spec.speculative.drafter = rec;
  const SchedRun got = run_scheduler(reqs, spec, 64);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i;
  EXPECT_GT(got.sum.accepted, 0) << "no draft kept: multi-token observes not exercised";
  EXPECT_LT(got.sum.accepted, got.sum.drafted) << "every draft kept: rejections not exercised";
  EXPECT_GT(rec->longest_, 2) << "no observe of a kept run longer than two tokens after the prompts";
  ASSERT_FALSE(rec->points_.empty());
  // replay every recorded point
  for (size_t pi = 0; pi < rec->points_.size(); ++pi) {
    const auto& p = rec->points_[pi];
    const std::vector<int32_t>& f = full[p.seq];
    std::vector<int32_t> toks(f.begin(), f.begin() + int64_t(p.history.size()));  // tokens 0 .. len - 1
    ASSERT_TRUE(std::equal(p.history.begin(), p.history.end(), f.begin() + 1)) << "point " << pi;
    auto b = t.backend(64);
    StepBatch sb;
    std::vector<int32_t> table(16);
    for (int k = 0; k < 16; ++k) table[size_t(k)] = k;
    sb.seqs.push_back(SeqStep{0, toks, table, false});
    sb.seqs[0].want_aux = true;
    sb.aux_layers = d.model->spec().aux_layers;
    const StepOutput o = b->step(sb);
    ref::Eagle3Drafter fresh(d.model);
    fresh.observe(7, 0, p.history, o.aux_row(0, 0));
    EXPECT_EQ(fresh.propose(7, p.k), p.drafts) << "point " << pi << " (sequence " << p.seq << ", "
                                               << p.history.size() << " positions observed)";
  }
  std::printf("  [eagle3 bookkeeping] %zu draft points replayed, %d observes (longest %d tokens), %d of %d drafts "
              "kept\n", rec->points_.size(), rec->observes_, rec->longest_, got.sum.accepted, got.sum.drafted);
}

// The fixture checkpoint (tests/data/tiny-m3-a, what transformers' golden data was written from)
// with a synthetic draft loaded beside it (its embedding and lm_head read from the checkpoint): the
// golden prompts decode to the same greedy ids with and without EAGLE3 drafts.
TEST(Eagle3, FixtureCheckpointGreedyIdsWithDrafts) {
  const fs::path dir = fs::path(M3_TEST_DATA) / "tiny-m3-a";
  const ModelSpec spec = load_model_spec(dir);
  const auto golden = ref::load_golden(dir / "golden.safetensors");
  ASSERT_FALSE(golden.empty());
  const test::TempDir tmp;
  write_synthetic_eagle3(tmp.path / "eagle3", spec, {});
  auto drafter = ref::load_eagle3_drafter(tmp.path / "eagle3", dir, spec, 2);
  auto w = load_model_weights(dir, spec);
  int verify = 0;
  for (const auto& g : golden) {
    GenerateRequest r;
    r.prompt = g.ids;
    r.max_tokens = g.steps();
    auto b = ref::make_ref_backend(spec, w, ref::RefOptions{64, 2});
    const std::vector<int32_t> plain = generate(*b, r).ids;
    r.speculative.method = SpeculativeMethod::Eagle3;
    r.speculative.drafter = drafter;
    auto b2 = ref::make_ref_backend(spec, w, ref::RefOptions{64, 2});
    const GenerateResult got = generate(*b2, r);
    EXPECT_EQ(got.ids, plain) << "golden prompt p" << g.index;
    verify += got.verify_steps;
  }
  EXPECT_GT(verify, 0);
}

// A drafter that throws now and then (a bad value in a draft checkpoint, say) costs its requests
// their drafts, never their outputs or the step.
TEST(Eagle3, AFailingDrafterOnlyCostsDrafts) {
  class Flaky final : public Drafter {
   public:
    explicit Flaky(std::shared_ptr<ref::Eagle3Drafter> d) : d_(std::move(d)) {}
    std::string name() const override { return "flaky"; }
    const std::vector<int>& aux_layers() const override { return d_->aux_layers(); }
    void observe(uint64_t seq, int32_t start, std::span<const int32_t> next, const float* aux) override {
      if (++calls_ % 5 == 0) M3_FAIL("flaky drafter: observe {} fails", calls_);
      d_->observe(seq, start, next, aux);
    }
    std::vector<int32_t> propose(uint64_t seq, int k) override {
      if (++calls_ % 7 == 0) M3_FAIL("flaky drafter: propose {} fails", calls_);
      return d_->propose(seq, k);
    }
    void release(uint64_t seq) override { d_->release(seq); }
    int calls_ = 0;
    std::shared_ptr<ref::Eagle3Drafter> d_;
  };
  const Draft d = make_draft(false, 3);
  auto inner = std::make_shared<ref::Eagle3Drafter>(d.model);
  auto flaky = std::make_shared<Flaky>(inner);
  std::mt19937 rng(std::random_device{}());
  const std::vector<GenerationRequest> reqs = random_requests(rng, 5, 10, 10);
  SchedulerOptions plain;
  plain.max_num_seqs = 3;
  const SchedRun want = run_scheduler(reqs, plain, 64);
  SchedulerOptions spec = plain;
  spec.speculative.method = SpeculativeMethod::Eagle3;
  spec.speculative.drafter = flaky;
  const SchedRun got = run_scheduler(reqs, spec, 64);  // requests that end in an error fail there
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.tokens[i], want.tokens[i]) << "request " << i;
  EXPECT_GT(got.drafter_failures, 0) << "the flaky drafter never failed: the case is not exercised";
  EXPECT_NE(got.last_drafter_error.find("flaky drafter"), std::string::npos) << got.last_drafter_error;
  EXPECT_EQ(inner->sequences(), 0u);
}

TEST(Eagle3, BackendsWithoutAuxRowsAreRefused) {
  // a backend that returns no aux rows (the CUDA backends today): the scheduler refuses eagle3 up front
  class NoAux final : public Backend {
   public:
    std::string name() const override { return "no-aux"; }
    const ModelSpec& spec() const override { return test::tiny().spec; }
    int cache_block_size() const override { return 128; }
    int num_cache_blocks() const override { return 4; }
    StepOutput step(const StepBatch&, SelectionTrace*) override { return {}; }
  } b;
  const Draft d = make_draft(false, 5);
  SchedulerOptions o;
  o.speculative.method = SpeculativeMethod::Eagle3;
  o.speculative.drafter = std::make_shared<ref::Eagle3Drafter>(d.model);
  try {
    Scheduler s(b, o);
    ADD_FAILURE() << "the scheduler took eagle3 over a backend without aux rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-aux backend does not return"), std::string::npos) << e.what();
  }
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.speculative = o.speculative;
  EXPECT_THROW(generate(b, r), Error);
  SchedulerOptions none;
  none.speculative.method = SpeculativeMethod::Eagle3;  // no drafter
  EXPECT_THROW(Scheduler(b, none), Error);
}

// eagle3_greedy (the GPU draft's choice over its draft logits) against what the reference does:
// scatter the draft logits into the target vocabulary (-inf elsewhere) and take the first maximum.
// Random logits with planted ties (equal values at several draft ids), NaN and -inf entries, with
// and without a d2t map (increasing target ids with random gaps).
TEST(Eagle3, GreedyChoiceOverTheDraftVocabulary) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int ties = 0;
  for (int rep = 0; rep < 300; ++rep) {
    const int n = 1 + int(rng() % 64);
    std::vector<int32_t> d2t;
    int vocab = n;
    if (rep % 2) {
      int t = int(rng() % 5);
      for (int i = 0; i < n; ++i) {
        d2t.push_back(t - i);
        t += 1 + int(rng() % 4);
      }
      vocab = t;
    }
    std::vector<float> dl(static_cast<size_t>(n));
    for (auto& x : dl) x = float(int(rng() % 7)) - 3.f;  // few distinct values: ties are common
    if (rep % 5 == 0) dl[rng() % size_t(n)] = NAN;
    if (rep % 7 == 0) dl[rng() % size_t(n)] = -INFINITY;
    if (rep % 31 == 0) std::fill(dl.begin(), dl.end(), -INFINITY);
    std::vector<float> full(static_cast<size_t>(vocab), -INFINITY);
    for (int i = 0; i < n; ++i) full[size_t(i + (d2t.empty() ? 0 : d2t[size_t(i)]))] = dl[size_t(i)];
    // the first maximum, NaN never taken (max_element's rule with NaN is order-dependent)
    int32_t want = 0;
    for (int i = 0; i < vocab; ++i)
      if (full[size_t(i)] > full[size_t(want)] || std::isnan(full[size_t(want)])) want = i;
    if (std::isnan(full[size_t(want)]) || full[size_t(want)] == -INFINITY) want = 0;
    ties += int(std::count(full.begin(), full.end(), full[size_t(want)]) > 1);
    EXPECT_EQ(eagle3_greedy(dl.data(), n, d2t), want) << "rep " << rep << " n " << n;
  }
  EXPECT_GT(ties, 30) << "too few ties drawn to test the tie rule";
}

