// Synthetic EAGLE3 drafts (model/synthetic_eagle3.h).
#include "model/synthetic_eagle3.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "core/check.h"
#include "core/codecs.h"
#include "core/counter_rng.h"
#include "model/safetensors.h"

namespace m3 {

Eagle3Spec synthetic_eagle3_spec(const ModelSpec& target, const SyntheticEagle3Options& opt) {
  Eagle3Spec s;
  s.hidden = s.target_hidden = target.hidden;
  s.num_heads = opt.num_heads;
  s.num_kv_heads = opt.num_kv_heads;
  s.head_dim = opt.head_dim > 0 ? opt.head_dim : std::max(2, (target.hidden / 4) & ~1);
  s.intermediate = 2 * target.hidden;
  s.vocab = target.vocab_size;
  s.draft_vocab = opt.reduced_vocab ? (target.vocab_size + 1) / 2 : target.vocab_size;
  s.rms_eps = 1e-6f;
  s.rope_theta = 10000;
  s.aux_layers = opt.aux_layers.empty() ? eagle3_default_aux_layers(target.num_layers) : opt.aux_layers;
  return s;
}

Eagle3Spec write_synthetic_eagle3(const std::filesystem::path& dir, const ModelSpec& target,
                                  const SyntheticEagle3Options& opt) {
  const Eagle3Spec s = synthetic_eagle3_spec(target, opt);
  std::filesystem::create_directories(dir);
  SafetensorsWriter w;
  uint64_t tensor = 0;
  // BF16 values: uniform in [-a, a) (a = 1 / sqrt(fan_in) for matrices), or 1 + that for norms
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double a, double center) {
    const uint64_t seed = opt.seed * 1000003 + ++tensor;
    w.add(name, DType::BF16, shape, [seed, a, center](uint8_t* dst, size_t nbytes) {
      for (size_t i = 0; i < nbytes / 2; ++i) {
        const uint16_t h = f32_to_bf16(float(center + a * (2 * rng::uniform_draw(seed, i) - 1)));
        std::memcpy(dst + 2 * i, &h, 2);
      }
    });
  };
  const int64_t H = s.hidden, I = s.intermediate;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    add(name, {rows, cols}, 1.0 / std::sqrt(double(cols)), 0);
  };
  auto norm = [&](const std::string& name) { add(name, {H}, 0.1, 1); };
  mat("fc.weight", H, s.fc_in());
  norm("midlayer.input_layernorm.weight");
  norm("midlayer.hidden_norm.weight");
  norm("midlayer.post_attention_layernorm.weight");
  mat("midlayer.self_attn.q_proj.weight", s.q_dim(), 2 * H);
  mat("midlayer.self_attn.k_proj.weight", s.kv_dim(), 2 * H);
  mat("midlayer.self_attn.v_proj.weight", s.kv_dim(), 2 * H);
  mat("midlayer.self_attn.o_proj.weight", H, s.q_dim());
  mat("midlayer.mlp.gate_proj.weight", I, H);
  mat("midlayer.mlp.up_proj.weight", I, H);
  mat("midlayer.mlp.down_proj.weight", H, I);
  norm("norm.weight");
  if (opt.reduced_vocab) {  // draft id i -> target id 2i
    mat("lm_head.weight", s.draft_vocab, H);
    std::vector<uint8_t> d2t(size_t(s.draft_vocab) * 8);
    for (int64_t i = 0; i < s.draft_vocab; ++i) std::memcpy(d2t.data() + 8 * size_t(i), &i, 8);
    w.add("d2t", DType::I64, {s.draft_vocab}, std::move(d2t));
    std::vector<uint8_t> t2d(size_t(s.vocab));
    for (int64_t t = 0; t < s.vocab; ++t) t2d[size_t(t)] = t % 2 == 0;
    w.add("t2d", DType::BOOL, {s.vocab}, std::move(t2d));
  }
  w.write(dir / "model.safetensors");
  std::ofstream(dir / "config.json") << eagle3_spec_to_json(s);
  return s;
}

}  // namespace m3
