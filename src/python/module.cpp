// The Python extension `m3mono._m3mono` (nanobind; python/m3mono/__init__.py wraps it): an Engine
// over a checkpoint directory (the backend `generate` / `serve` choose: cli/backend_choice.h), its
// tokenizer when the checkpoint has one, and make_tiny / info. m3::Error arrives in Python as
// m3mono.Error (a ValueError) with the same message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/backend_choice.h"
#include "core/check.h"
#include "model/spec.h"
#include "model/synthetic.h"
#include "runtime/generate.h"
#include "text/tiny_files.h"
#include "text/tokenizer.h"

namespace nb = nanobind;
using namespace m3;

namespace {

class Engine {
 public:
  Engine(const std::string& model_dir, const std::string& device, int tp, bool mono, int threads, int max_model_len)
      : dir_(model_dir) {
    M3_CHECK(std::filesystem::is_directory(model_dir), "LLM: model {} is not a directory", model_dir);
    spec_ = load_model_spec(model_dir);
    int len = max_model_len > 0 ? max_model_len : 4096;
    if (spec_.max_positions > 0) len = std::min(len, spec_.max_positions);
    M3_CHECK(len >= 2, "LLM: max_model_len {} (at least 2)", len);
    max_len_ = len;
    cli::BackendChoice c{device, "checkpoint", threads, (len + spec_.index_block - 1) / spec_.index_block, len};
    c.mono = mono;
    c.tp = tp;
    backend_ = cli::make_chosen_backend(c, model_dir, spec_, "LLM");
    const auto tok = std::filesystem::path(model_dir) / "tokenizer.json";
    if (std::filesystem::exists(tok)) tokenizer_ = text::Tokenizer::load(tok.string(), spec_.vocab_size);
  }
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int max_tokens, float temperature, int top_k,
                                float top_p, uint64_t seed, bool stop_at_eos) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams{temperature, top_k, top_p, seed};
    r.seed = seed;
    r.stop_id = stop_at_eos ? spec_.eos_id : -1;
    M3_CHECK(generate_positions(r) <= max_len_, "LLM: {} prompt tokens + {} new tokens exceed max_model_len {}",
             prompt.size(), max_tokens, max_len_);
    nb::gil_scoped_release release;  // the step loop holds no Python object
    return m3::generate(*backend_, r).ids;
  }
  std::vector<int32_t> encode(const std::string& text) const { return tok().encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const { return tok().decode(ids, true); }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  std::string name() const { return backend_->name(); }
  int vocab_size() const { return spec_.vocab_size; }
  int max_model_len() const { return max_len_; }
  int eos_id() const { return spec_.eos_id; }

 private:
  const text::Tokenizer& tok() const {
    M3_CHECK(tokenizer_.has_value(), "LLM: {} has no tokenizer.json: give prompts as token ids", dir_);
    return *tokenizer_;
  }
  std::string dir_;
  ModelSpec spec_;
  int max_len_ = 0;
  std::unique_ptr<Backend> backend_;
  std::optional<text::Tokenizer> tokenizer_;
};

std::string make_tiny(const std::string& out, const std::string& preset, uint64_t seed) {
  M3_CHECK(synthetic_preset_writable(preset), "make_tiny: preset '{}' is spec-only", preset);
  const ModelSpec spec = synthetic_preset(preset);
  SyntheticOptions opt;
  opt.seed = seed;
  write_synthetic_checkpoint(out, spec, opt);
  text::write_tiny_text_files(out, spec.vocab_size, spec.bos_id, spec.eos_id);
  return out;
}

std::map<std::string, int64_t> info(const std::string& model_dir) {
  const ModelSpec s = load_model_spec(model_dir);
  return {{"num_layers", s.num_layers},         {"sparse_layers", s.num_sparse_layers()},
          {"moe_layers", s.num_moe_layers()},   {"hidden_size", s.hidden},
          {"num_attention_heads", s.num_heads}, {"num_key_value_heads", s.num_kv_heads},
          {"head_dim", s.head_dim},             {"num_experts", s.num_experts},
          {"experts_per_token", s.top_k},       {"vocab_size", s.vocab_size},
          {"max_position_embeddings", s.max_positions}};
}

}  // namespace

NB_MODULE(_m3mono, m) {
  m.doc() = "m3mono: MiniMax-M3 inference (the C++ engine; see the m3mono package)";
  static nb::exception<m3::Error> error(m, "Error", PyExc_ValueError);
  nb::class_<Engine>(m, "Engine")
      .def(nb::init<const std::string&, const std::string&, int, bool, int, int>(), nb::arg("model_dir"),
           nb::arg("device") = "auto", nb::arg("tp") = 1, nb::arg("mono") = false, nb::arg("threads") = 0,
           nb::arg("max_model_len") = 0)
      .def("generate", &Engine::generate, nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("temperature"),
           nb::arg("top_k"), nb::arg("top_p"), nb::arg("seed"), nb::arg("stop_at_eos"))
      .def("encode", &Engine::encode)
      .def("decode", &Engine::decode)
      .def_prop_ro("has_tokenizer", &Engine::has_tokenizer)
      .def_prop_ro("name", &Engine::name)
      .def_prop_ro("vocab_size", &Engine::vocab_size)
      .def_prop_ro("max_model_len", &Engine::max_model_len)
      .def_prop_ro("eos_id", &Engine::eos_id);
  m.def("make_tiny", &make_tiny, nb::arg("out"), nb::arg("preset") = "tiny", nb::arg("seed") = 1);
  m.def("info", &info, nb::arg("model_dir"));
}
