// The --device / --weights options of `m3mono generate` and `m3mono conformance`
// (cli/backend_choice.h), through the binary: the CPU reference on the dequantized prepared
// weights runs and differs from the checkpoint's fp32 run (FP8/MXFP4 rounding is visible in the
// conformance figures), bad values are rejected naming the flag, and --device cuda without a usable
// GPU is a clear error rather than a silent fallback.
#include <gtest/gtest.h>

#include "common/process.h"
#include "common/temp_dir.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {


m3::test::CmdResult run(const std::string& args) { return m3::test::run_shell(std::string(M3_BINARY) + " " + args); }

const std::string kModel = std::string(M3_TEST_DATA) + "/tiny-m3-a";

}  // namespace

TEST(BackendChoiceCli, PreparedWeightsRunOnTheCpuReference) {
  // checkpoint weights: every check passes at the default bound
  auto fp32 = run("conformance --threads 2 --model " + kModel);
  EXPECT_EQ(fp32.rc, 0) << fp32.out;
  // prepared (FP8 attention, MXFP4 experts) dequantized: runs, and fails the fp32 bound — the
  // quantization is really in the weights the reference computes with
  auto prep = run("conformance --threads 2 --weights prepared --device cpu --model " + kModel);
  EXPECT_EQ(prep.rc, 1) << prep.out;
  EXPECT_NE(prep.out.find("(cpu-ref)"), std::string::npos) << prep.out;
  EXPECT_NE(prep.out.find("[FAIL] p0"), std::string::npos) << prep.out;
  auto gen = run("generate --device cpu --weights prepared --threads 2 --model " + kModel +
                 " --prompt-ids 1,15,92 --max-tokens 4");
  ASSERT_EQ(gen.rc, 0) << gen.out;
  EXPECT_EQ(std::count(gen.out.begin(), gen.out.end(), ','), 3) << gen.out;  // 4 ids
}

TEST(BackendChoiceCli, BadChoicesNameTheFlag) {
  auto w = run("generate --device cpu --weights fp4 --model " + kModel + " --prompt-ids 1 --max-tokens 2");
  EXPECT_NE(w.rc, 0);
  EXPECT_NE(w.out.find("--weights"), std::string::npos) << w.out;
  auto d = run("conformance --device tpu --model " + kModel);
  EXPECT_NE(d.rc, 0);
  EXPECT_NE(d.out.find("--device"), std::string::npos) << d.out;
  // no GPU on the CPU test machines (or no CUDA in the build): a clear error naming the flag
  auto c = run("generate --device cuda --model " + kModel + " --prompt-ids 1 --max-tokens 2");
  if (c.rc != 0) {
    EXPECT_NE(c.out.find("--device cuda"), std::string::npos) << c.out;
  }
}

// --draft-device (where an EAGLE3 draft runs): a bad value names the flag before anything loads;
// cuda without a usable GPU is a clear error, not a silent fallback to the CPU.
TEST(BackendChoiceCli, DraftDeviceRefusalsNameTheFlag) {
  const m3::test::TempDir tmp;
  auto mk = run("make-tiny --out " + tmp.path.string() + "/t --eagle3");
  ASSERT_EQ(mk.rc, 0) << mk.out;
  const std::string base = "generate --device cpu --threads 2 --model " + tmp.path.string() + "/t --prompt-ids 1,2,3 " +
                           "--max-tokens 3 --speculative eagle3 --draft-model " + tmp.path.string() + "/t/eagle3";
  auto bad = run(base + " --draft-device tpu");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("--draft-device must be auto, cpu or cuda, got 'tpu'"), std::string::npos) << bad.out;
  auto cpu = run(base + " --draft-device cpu");
  EXPECT_EQ(cpu.rc, 0) << cpu.out;
  auto cuda = run(base + " --draft-device cuda");
  if (cuda.rc != 0) EXPECT_NE(cuda.out.find("--draft-device cuda"), std::string::npos) << cuda.out;
}

TEST(BackendChoiceCli, CacheDtypeRoundsTheReferenceCaches) {
  // --cache-dtype fp8 on the CPU reference: its caches round through the GPU's FP8 codec, which
  // moves the logits (the checks print other worst errors than the exact run's)
  auto exact = run("conformance --threads 2 --weights prepared --device cpu --model " + kModel);
  auto fp8 = run("conformance --threads 2 --weights prepared --device cpu --cache-dtype fp8 --model " + kModel);
  EXPECT_EQ(fp8.rc, 1) << fp8.out;
  EXPECT_NE(fp8.out.find("(cpu-ref)"), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out.find("[FAIL] p0"), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out, exact.out);
  auto f32 = run("conformance --threads 2 --cache-dtype fp32 --model " + kModel);
  EXPECT_EQ(f32.rc, 0) << f32.out;  // explicit fp32: the exact default
  auto bad = run("conformance --cache-dtype fp4 --model " + kModel);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("--cache-dtype"), std::string::npos) << bad.out;
}

TEST(BackendChoiceCli, RouterDtypeBfloat16) {
  // --router-dtype bfloat16: the prepared store keeps the router weight in BF16. The checkpoint's
  // router weight is BF16 already, so the BF16 store is exact: the CPU reference over the
  // dequantized store must give bitwise the same figures as the float32 store; bad values name
  // the flag.
  auto f32 = run("conformance --threads 2 --weights prepared --device cpu --model " + kModel);
  auto bf16 = run("conformance --threads 2 --weights prepared --device cpu --router-dtype bfloat16 --model " + kModel);
  EXPECT_EQ(bf16.rc, 1) << bf16.out;  // the prepared weights fail the fp32 bound either way
  EXPECT_NE(bf16.out.find("(cpu-ref)"), std::string::npos) << bf16.out;
  // the store really holds the router in bf16: about half the float32 store's bytes (rows are
  // padded to 16 bytes, so not exactly half)
  auto router_bytes = [](const std::string& out, const char* type) -> long long {
    const std::string key = std::string("note: prepared router weight ") + type + " (";
    const size_t at = out.find(key);
    return at == std::string::npos ? -1 : std::atoll(out.c_str() + at + key.size());
  };
  const long long b16 = router_bytes(bf16.out, "bfloat16"), b32 = router_bytes(f32.out, "float32");
  EXPECT_GT(b32, 0) << f32.out;
  EXPECT_LT(b16, b32) << bf16.out;
  EXPECT_GE(2 * b16, b32) << bf16.out;
  // and, the checkpoint's router being BF16 already, the figures are bitwise the same
  auto figures = [](const std::string& out) { return out.substr(out.find("conformance of")); };
  EXPECT_EQ(figures(bf16.out), figures(f32.out));
  auto gen = run("generate --device cpu --weights prepared --router-dtype bfloat16 --threads 2 --model " + kModel +
                 " --prompt-ids 1,15,92 --max-tokens 4");
  ASSERT_EQ(gen.rc, 0) << gen.out;
  auto bad = run("generate --device cpu --router-dtype fp16 --model " + kModel + " --prompt-ids 1 --max-tokens 2");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("--router-dtype"), std::string::npos) << bad.out;
}
