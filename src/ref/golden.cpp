// load_golden(): through the project's safetensors reader; every tensor's dtype and shape checked
// against the others of its prompt before its bytes are copied out.
#include "ref/golden.h"

#include <fmt/format.h>

#include <cstring>
#include <regex>

#include "core/check.h"
#include "model/safetensors.h"

namespace m3::ref {

namespace {

const TensorView& need(const SafetensorsFile& f, const std::string& key, DType dt, size_t rank) {
  const TensorView* v = f.find(key);
  M3_CHECK(v, "golden {}: missing tensor {}", f.path(), key);
  M3_CHECK(v->dtype == dt, "golden {}: {} has dtype {}, expected {}", f.path(), key, dtype_name(v->dtype), dtype_name(dt));
  M3_CHECK(v->shape.size() == rank, "golden {}: {} has shape {}, expected rank {}", f.path(), key, v->shape_str(), rank);
  return *v;
}

std::vector<int32_t> ids_of(const SafetensorsFile& f, const std::string& key, int vocab) {
  const TensorView& v = need(f, key, DType::I64, 1);
  std::vector<int32_t> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x;
    std::memcpy(&x, v.data + i * 8, 8);
    M3_CHECK(x >= 0 && x < vocab, "golden {}: {}[{}] = {} is outside the vocabulary [0, {})", f.path(), key, i, x, vocab);
    out[i] = int32_t(x);
  }
  return out;
}

std::vector<float> floats_of(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  std::memcpy(out.data(), v.data, out.size() * 4);
  return out;
}

}  // namespace

std::vector<GoldenPrompt> load_golden(const std::filesystem::path& file) {
  SafetensorsFile f(file);
  std::map<int, GoldenPrompt> prompts;
  const std::regex re_ids(R"(p(\d+)\.ids)"), re_blocks(R"(p(\d+)\.prefill_blocks\.layer(\d+))"),
      re_any(R"(p(\d+)\.(prefill_logits|greedy_ids|step_logits))");
  for (const TensorView& v : f.tensors()) {
    std::smatch m;
    if (std::regex_match(v.name, m, re_ids)) prompts[std::stoi(m[1])].index = std::stoi(m[1]);
    else if (!std::regex_match(v.name, m, re_blocks) && !std::regex_match(v.name, m, re_any))
      M3_FAIL("golden {}: unexpected tensor {}", f.path(), v.name);
  }
  M3_CHECK(!prompts.empty(), "golden {}: no p{{i}}.ids tensor", f.path());
  std::vector<GoldenPrompt> out;
  for (auto& [i, g] : prompts) {
    const std::string p = fmt::format("p{}.", i);
    const TensorView& pl = need(f, p + "prefill_logits", DType::F32, 2);
    g.vocab = int(pl.shape[1]);
    M3_CHECK(g.vocab > 0, "golden {}: {}prefill_logits has shape {}", f.path(), p, pl.shape_str());
    g.ids = ids_of(f, p + "ids", g.vocab);
    M3_CHECK(!g.ids.empty() && pl.shape[0] == int64_t(g.ids.size()),
             "golden {}: {}prefill_logits has shape {} for {} prompt tokens", f.path(), p, pl.shape_str(), g.ids.size());
    g.prefill_logits = floats_of(pl);
    g.greedy_ids = ids_of(f, p + "greedy_ids", g.vocab);
    const TensorView& sl = need(f, p + "step_logits", DType::F32, 2);
    M3_CHECK(sl.shape[0] == int64_t(g.greedy_ids.size()) && sl.shape[1] == g.vocab,
             "golden {}: {}step_logits has shape {}, expected [{}, {}]", f.path(), p, sl.shape_str(),
             g.greedy_ids.size(), g.vocab);
    g.step_logits = floats_of(sl);
    for (const TensorView& v : f.tensors()) {
      std::smatch m;
      if (!std::regex_match(v.name, m, re_blocks) || std::stoi(m[1]) != i) continue;
      const TensorView& b = need(f, v.name, DType::I32, 3);
      GoldenBlocks gb;
      gb.heads = int(b.shape[0]);
      gb.tokens = int(b.shape[1]);
      gb.k = int(b.shape[2]);
      M3_CHECK(gb.tokens == g.tokens() && gb.heads > 0 && gb.k > 0,
               "golden {}: {} has shape {} for {} prompt tokens", f.path(), v.name, b.shape_str(), g.tokens());
      gb.ids.resize(size_t(b.numel()));
      std::memcpy(gb.ids.data(), b.data, gb.ids.size() * 4);
      g.prefill_blocks[std::stoi(m[2])] = std::move(gb);
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace m3::ref
