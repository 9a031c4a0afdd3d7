// Conformance of the CPU reference against every golden fixture in tests/data/*/golden.safetensors
// (transformers float64): a new fixture directory is tested without editing this file. Also checks
// that the conformance checks themselves catch a wrong engine or wrong golden values.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "common/process.h"
#include "common/random.h"
#include "core/check.h"
#include "model/load_weights.h"
#include "model/spec.h"
#include "ref/conformance.h"
#include "ref/engine.h"
#include "ref/golden.h"

using namespace m3;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> fixtures() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(M3_TEST_DATA))
    if (e.is_directory() && fs::exists(e.path() / "golden.safetensors")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<Backend> backend_for(const fs::path& dir, const std::vector<ref::GoldenPrompt>& golden,
                                     ModelWeights* keep = nullptr) {
  ModelSpec spec = load_model_spec(dir);
  ModelWeights w = load_model_weights(dir, spec);
  if (keep) *keep = w;
  int most = 0;
  for (const auto& g : golden) most = std::max(most, g.tokens() + g.steps());
  return ref::make_ref_backend(spec, std::move(w), ref::RefOptions{most / spec.index_block + 2, 2});
}

std::string failures(const ref::ConformanceReport& r) {
  std::string s;
  for (const auto& c : r.checks)
    if (!c.ok) s += c.name + ": " + c.detail + "\n";
  return s;
}

}  // namespace

TEST(Conformance, EveryFixturePasses) {
  auto dirs = fixtures();
  ASSERT_FALSE(dirs.empty()) << "no tests/data/*/golden.safetensors";
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    auto golden = ref::load_golden(dir / "golden.safetensors");
    auto b = backend_for(dir, golden);
    auto rep = ref::run_conformance(*b, golden);
    EXPECT_TRUE(rep.ok()) << failures(rep);
    double worst = 0;
    for (const auto& c : rep.checks)
      if (c.name.find("logits") != std::string::npos) worst = std::max(worst, c.worst);
    std::printf("%s: %zu checks, worst logits max|d|/max|ref| %.3g (bound 1e-3)\n", dir.filename().c_str(),
                rep.checks.size(), worst);
    // the bound is 1e-3; an exact fp32 engine is ~1e-6, so anything near 1e-4 means a real deviation
    EXPECT_LT(worst, 1e-4);
  }
}

TEST(Conformance, CatchesWrongEngineAndWrongGolden) {
  auto dirs = fixtures();
  ASSERT_FALSE(dirs.empty());
  const fs::path dir = dirs.front();
  auto golden = ref::load_golden(dir / "golden.safetensors");
  golden.resize(1);  // the first prompt is enough here
  std::mt19937_64 rng(m3::test::fresh_seed());
  auto names_failed = [](const ref::ConformanceReport& r) {
    std::string s;
    for (const auto& c : r.checks)
      if (!c.ok) s += c.name.substr(c.name.rfind(')') + 2) + ";";
    return s;
  };
  {  // a golden selection changed: only the selection check fails
    auto g = golden;
    auto& gb = g[0].prefill_blocks.begin()->second;
    int t = gb.tokens - 1;
    int32_t* row = gb.ids.data() + (size_t(t)) * gb.k;  // group 0, last token
    row[0] = row[0] == 0 ? 1 : 0;
    bool dup = false;
    for (int j = 1; j < gb.k; ++j) dup |= row[j] == row[0];
    if (dup) row[0] = -1;  // the set now lacks an element instead
    auto rep = ref::run_conformance(*backend_for(dir, g), g);
    EXPECT_EQ(names_failed(rep), "prefill selections;");
  }
  {  // a golden greedy id changed: the greedy check fails
    auto g = golden;
    g[0].greedy_ids.back() = (g[0].greedy_ids.back() + 1) % g[0].vocab;
    auto rep = ref::run_conformance(*backend_for(dir, g), g);
    EXPECT_EQ(names_failed(rep), "greedy ids;");
  }
  {  // golden logits off by 2e-3 of a row's max in one element: the logits checks fail
    auto g = golden;
    float mx = 0;
    for (int v = 0; v < g[0].vocab; ++v) mx = std::max(mx, std::fabs(g[0].prefill_logits[size_t(v)]));
    g[0].prefill_logits[size_t(rng() % size_t(g[0].vocab))] += 2e-3f * mx;
    auto rep = ref::run_conformance(*backend_for(dir, g), g);
    EXPECT_EQ(names_failed(rep), "prefill logits;");
  }
  {  // a wrong engine (rope_theta off by 2x, a plausible config bug) fails the logits checks
    ModelSpec spec = load_model_spec(dir);
    ModelWeights w = load_model_weights(dir, spec);
    spec.rope_theta *= 2;
    auto b = ref::make_ref_backend(spec, std::move(w), ref::RefOptions{64, 2});
    auto rep = ref::run_conformance(*b, golden);
    EXPECT_NE(names_failed(rep).find("prefill logits;"), std::string::npos) << names_failed(rep);
  }
}

TEST(Conformance, GoldenReaderRejectsMissingFile) {
  EXPECT_THROW(ref::load_golden(fs::path(M3_TEST_DATA) / "no-such" / "golden.safetensors"), m3::Error);
}

namespace {
// stdout (and stderr after it unless stdout_only) of `m3mono args`
m3::test::CmdResult run_cmd(const std::string& args, bool stdout_only = false) {
  return m3::test::run_shell(std::string(M3_BINARY) + " " + args + (stdout_only ? " 2>/dev/null" : ""), !stdout_only);
}
}  // namespace

TEST(ConformanceCli, ExitCodeFollowsTheChecks) {
  const fs::path dir = fixtures().front();
  auto ok = run_cmd("conformance --threads 2 --model " + dir.string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("PASS"), std::string::npos) << ok.out;
  // a bound no fp32 engine can meet: every logits check must fail and the exit code say so
  auto bad = run_cmd("conformance --threads 2 --tol 1e-12 --model " + dir.string() + " --golden " +
                     (dir / "golden.safetensors").string());
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("[FAIL] p0"), std::string::npos) << bad.out;
  auto missing = run_cmd("conformance --model " + dir.string() + " --golden /nonexistent/golden.safetensors");
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.out.find("nonexistent"), std::string::npos) << missing.out;
}

TEST(ConformanceCli, TensorParallelRanksOnTheCpu) {
  // --tp 2 on the CPU reference: the fixture whose KV heads two ranks split passes; one whose 3 KV
  // heads they cannot split is refused, naming the dimension; --tp 0 is refused naming the flag
  const fs::path a = fs::path(M3_TEST_DATA) / "tiny-m3-a", b = fs::path(M3_TEST_DATA) / "tiny-m3-b";
  auto ok = run_cmd("conformance --threads 2 --tp 2 --device cpu --model " + a.string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("cpu-ref tp2"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("PASS"), std::string::npos) << ok.out;
  auto no = run_cmd("conformance --threads 2 --tp 2 --device cpu --model " + b.string());
  EXPECT_NE(no.rc, 0) << no.out;
  EXPECT_NE(no.out.find("num_key_value_heads = 3"), std::string::npos) << no.out;
  auto zero = run_cmd("generate --tp 0 --device cpu --prompt-ids 1 --model " + a.string());
  EXPECT_NE(zero.rc, 0) << zero.out;
  EXPECT_NE(zero.out.find("--tp"), std::string::npos) << zero.out;
}

TEST(GenerateCli, GreedyReproducesGoldenContinuation) {
  const fs::path dir = fixtures().front();
  auto golden = ref::load_golden(dir / "golden.safetensors");
  const auto& g = golden.front();
  std::string ids, want;
  for (int32_t t : g.ids) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  for (int32_t t : g.greedy_ids) want += (want.empty() ? "" : ",") + std::to_string(t);
  auto r = run_cmd("generate --device cpu --threads 2 --model " + dir.string() + " --prompt-ids " + ids +
                   " --max-tokens " + std::to_string(g.steps()));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(want + "\n"), std::string::npos) << "want " << want << "\ngot " << r.out;
  EXPECT_NE(r.out.find("prefill: "), std::string::npos);
  EXPECT_NE(r.out.find("decode: "), std::string::npos);
  // seeded sampling is reproducible from the command line
  std::string samp = "generate --model " + dir.string() + " --prompt-ids 1,2,3 --max-tokens 8 --temperature 0.9 --top-p 0.95 --seed 11";
  auto s1 = run_cmd(samp + " --threads 1", true), s2 = run_cmd(samp + " --threads 2", true);
  ASSERT_EQ(s1.rc, 0) << s1.out;
  EXPECT_EQ(std::count(s1.out.begin(), s1.out.end(), ','), 7) << s1.out;
  EXPECT_EQ(s1.out, s2.out);
  // bad input: a clear error, non-zero exit
  auto oov = run_cmd("generate --model " + dir.string() + " --prompt-ids 1," + std::to_string(g.vocab) + " --max-tokens 2");
  EXPECT_NE(oov.rc, 0);
  EXPECT_NE(oov.out.find("outside the vocabulary"), std::string::npos) << oov.out;
  auto dev = run_cmd("generate --model " + dir.string() + " --prompt-ids 1 --device tpu");
  EXPECT_NE(dev.rc, 0);
  EXPECT_NE(dev.out.find("--device"), std::string::npos) << dev.out;
}
