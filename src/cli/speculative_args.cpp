// speculative_args.h.
#include "cli/speculative_args.h"

#include <CLI/CLI.hpp>

#include "cli/backend_choice.h"
#include "core/check.h"
#include "ref/eagle3.h"
#if M3_WITH_CUDA
#include "native/eagle3_net.h"
#endif

namespace m3::cli {

void add_speculative_options(CLI::App& app, SpeculativeArgs& a) {
  app.add_option("--speculative", a.method,
                 "speculative decoding: none, ngram (drafts: the continuation of the latest earlier occurrence "
                 "of the last n tokens) or eagle3 (drafts of an EAGLE3 draft model, --draft-model, over the target's "
                 "hidden states: the CPU reference or one GPU; the draft runs where --draft-device says); greedy "
                 "output is exactly that of plain decoding")
      ->capture_default_str();
  app.add_option("--num-draft-tokens", a.num_draft_tokens, "drafts per verify step (1..3)")->capture_default_str();
  app.add_option("--ngram-min", a.ngram_min, "shortest n-gram matched")->capture_default_str();
  app.add_option("--ngram-max", a.ngram_max, "longest n-gram matched (tried first)")->capture_default_str();
  app.add_option("--draft-model", a.draft_model,
                 "eagle3: the draft checkpoint directory (config.json + model.safetensors of a LlamaForCausalLMEagle3, "
                 "e.g. Inferact/MiniMax-M3-EAGLE3; `make-tiny --eagle3` writes a synthetic one)");
  app.add_option("--draft-threads", a.draft_threads, "eagle3: CPU threads of the draft model (0 = all cores)")
      ->capture_default_str();
  app.add_option("--draft-device", a.draft_device,
                 "eagle3: where the draft model runs: cpu (the reference), cuda (the current GPU, native kernels) or "
                 "auto (the target's device)")
      ->capture_default_str();
}

SpeculativeOptions speculative_options(const SpeculativeArgs& a, const std::string& what, const std::string& model_dir,
                                       const ModelSpec& target, bool target_on_gpu) {
  SpeculativeOptions o;
  try {
    o.method = parse_speculative_method(a.method);
    o.num_draft_tokens = a.num_draft_tokens;
    o.ngram_min = a.ngram_min;
    o.ngram_max = a.ngram_max;
    M3_CHECK(o.method == SpeculativeMethod::Eagle3 || a.draft_model.empty(),
             "--draft-model is for --speculative eagle3 (got --speculative {})", a.method);
    M3_CHECK(o.method != SpeculativeMethod::Eagle3 || !a.draft_model.empty(),
             "--speculative eagle3 needs --draft-model DIR (an EAGLE3 draft checkpoint)");
    M3_CHECK(a.draft_threads >= 0, "--draft-threads must be >= 0, got {}", a.draft_threads);
    M3_CHECK(a.draft_device == "auto" || a.draft_device == "cpu" || a.draft_device == "cuda",
             "--draft-device must be auto, cpu or cuda, got '{}'", a.draft_device);
    const bool gpu = a.draft_device == "cuda" || (a.draft_device == "auto" && target_on_gpu);
    if (o.method == SpeculativeMethod::Eagle3 && gpu) {
#if M3_WITH_CUDA
      M3_CHECK(cuda_usable(), "--draft-device cuda: no usable GPU is visible");
      Eagle3Checkpoint c = load_eagle3_checkpoint(a.draft_model, model_dir, target);
      o.drafter = std::make_shared<Eagle3Drafter>(std::make_shared<native::CudaEagle3Net>(std::move(c.spec), std::move(c.weights)));
#else
      M3_FAIL("--draft-device cuda: this build has no CUDA");
#endif
    } else if (o.method == SpeculativeMethod::Eagle3) {
      o.drafter = ref::load_eagle3_drafter(a.draft_model, model_dir, target, a.draft_threads);
    }
    validate_speculative(o);
  } catch (const Error& e) {
    M3_FAIL("{}: --speculative / --num-draft-tokens / --ngram-min / --ngram-max / --draft-model: {}", what, e.what());
  }
  return o;
}

}  // namespace m3::cli
