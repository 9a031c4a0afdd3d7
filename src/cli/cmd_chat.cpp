// `m3mono chat --model DIR`: a conversation in the terminal with a checkpoint that has a tokenizer
// and a chat template. Each line typed is a user turn; the whole conversation is rendered with the
// template (as /v1/chat/completions renders it), the answer streams as it is generated, its
// thinking (serve/reasoning.h) shown dimmed and kept out of the history's content. `/reset` forgets
// the conversation, `/quit` (or end of input) leaves. Greedy by default, so a script gets the
// same answers every time.
#include <fmt/format.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/backend_choice.h"
#include "cli/command.h"
#include "core/check.h"
#include "model/spec.h"
#include "runtime/engine.h"
#include "serve/reasoning.h"
#include "serve/text_stream.h"
#include "text/template_chat.h"
#include "text/tokenizer.h"

namespace m3::cli {
namespace {

struct ChatArgs {
  std::string model, device = "auto", weights = "checkpoint", thinking = "adaptive", system, color = "auto";
  int max_tokens = 256, threads = 0, cache_blocks = 0, max_model_len = 4096;
  float temperature = 0, top_p = 1;
  int top_k = 0;
  uint64_t seed = 0;
  bool mono = false;
};

constexpr const char* kDim = "\x1b[2m";
constexpr const char* kReset = "\x1b[0m";

int run_chat(const ChatArgs& a) {
  serve::ThinkingMode mode;
  M3_CHECK(serve::parse_thinking_mode(a.thinking, &mode), "chat: --thinking must be enabled, disabled or adaptive, got '{}'",
           a.thinking);
  M3_CHECK(a.color == "auto" || a.color == "always" || a.color == "never",
           "chat: --color must be auto, always or never, got '{}'", a.color);
  M3_CHECK(a.max_tokens >= 1, "chat: --max-tokens must be >= 1, got {}", a.max_tokens);
  SamplingParams sp{a.temperature, a.top_k, a.top_p, a.seed};
  validate_sampling(sp);
  const bool color = a.color == "always" || (a.color == "auto" && isatty(STDOUT_FILENO));
  const std::filesystem::path dir(a.model);
  M3_CHECK(std::filesystem::is_directory(dir), "chat: --model {} is not a directory", a.model);
  M3_CHECK(std::filesystem::exists(dir / "tokenizer.json"), "chat: {} has no tokenizer.json (make-tiny writes one)",
           a.model);
  const ModelSpec spec = load_model_spec(dir);
  const text::Tokenizer tok = text::Tokenizer::load(dir.string(), spec.vocab_size);
  const text::ChatTemplate tmpl = text::ChatTemplate::compile(text::load_chat_template_source(dir));

  M3_CHECK(a.max_model_len >= 16, "chat: --max-model-len must be >= 16, got {}", a.max_model_len);
  // one conversation at a time: enough blocks for the whole context unless told otherwise
  const int blocks = a.cache_blocks > 0 ? a.cache_blocks : (a.max_model_len + spec.index_block - 1) / spec.index_block;
  BackendChoice choice{a.device, a.weights, a.threads, blocks, a.max_model_len};
  choice.mono = a.mono;
  validate_backend_choice(choice, "chat");
  EngineOptions eo;
  eo.scheduler.max_model_len = a.max_model_len;
  Engine engine(make_chosen_backend(choice, a.model, spec, "chat"), eo);
  std::fprintf(stderr, "m3mono chat: %s (%s, thinking %s); /reset forgets, /quit leaves\n", a.model.c_str(),
               engine.stats().backend.c_str(), a.thinking.c_str());

  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  if (!a.system.empty()) history.push_back({{"role", "system"}, {"content", a.system}});
  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/quit") break;
    if (line == "/reset") {
      history = nlohmann::ordered_json::array();
      if (!a.system.empty()) history.push_back({{"role", "system"}, {"content", a.system}});
      std::puts("(conversation reset)");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    const nlohmann::ordered_json ctx = {
        {"messages", history}, {"add_generation_prompt", true}, {"thinking_mode", a.thinking}};
    const std::string rendered = tmpl.render(ctx);
    GenerationRequest r;
    r.prompt = tok.encode(rendered, false);
    const int room = engine.max_model_len() - int(r.prompt.size());
    if (room < 1) {
      std::printf("(the conversation fills the context of %d tokens: /reset)\n", engine.max_model_len());
      history.erase(history.end() - 1);
      continue;
    }
    r.max_tokens = std::min(a.max_tokens, room);
    r.sampling = sp;
    // the answer as it streams: decoded (stop strings: none), split into thinking and content
    serve::TextStream text(tok, {}, true);
    serve::ReasoningSplit split(mode);
    std::string reasoning, content;
    bool dim = false, done = false;
    std::mutex mu;
    std::condition_variable cv;
    auto show = [&](const serve::ReasoningSplit::Out& o) {
      if (!o.reasoning.empty()) {
        if (color && !dim) std::fputs(kDim, stdout);
        dim = true;
        std::fputs(o.reasoning.c_str(), stdout);
        reasoning += o.reasoning;
      }
      if (!o.content.empty()) {
        if (dim) {
          if (color) std::fputs(kReset, stdout);
          else std::fputs("\n", stdout);
          dim = false;
        }
        std::fputs(o.content.c_str(), stdout);
        content += o.content;
      }
      std::fflush(stdout);
    };
    engine.submit(r, [&](const RequestEvent& ev) {
      std::string d;
      for (int32_t t : ev.new_tokens) d += text.push(t);
      if (ev.finished) d += text.finish();
      show(split.push(d, ev.finished));
      if (ev.finished) {
        if (ev.reason == FinishReason::Error) std::printf("\n(generation failed: %s)", ev.error.c_str());
        std::lock_guard lk(mu);
        done = true;
        cv.notify_all();
      }
    });
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return done; });
    }
    if (color && dim) std::fputs(kReset, stdout);
    std::puts("");
    nlohmann::ordered_json turn = {{"role", "assistant"}, {"content", content}};
    if (split.reasoned()) turn["reasoning_content"] = reasoning;
    history.push_back(std::move(turn));
  }
  std::puts("");
  engine.shutdown(std::chrono::milliseconds(0));
  return 0;
}

RunFn setup_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  app.add_option("--model", a->model, "checkpoint directory with tokenizer.json and a chat template")->required();
  app.add_option("--thinking", a->thinking, "thinking_mode for the chat template: enabled, disabled or adaptive")
      ->capture_default_str();
  app.add_option("--system", a->system, "a system message first");
  app.add_option("--max-tokens", a->max_tokens, "tokens per answer at most")->capture_default_str();
  app.add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", a->top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--top-p", a->top_p, "nucleus mass (1 = off)")->capture_default_str();
  app.add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  app.add_option("--color", a->color, "thinking shown dimmed: auto (when stdout is a terminal), always, never")
      ->capture_default_str();
  app.add_option("--device", a->device, "cpu, cuda or auto (auto: CUDA when available, else cpu)")->capture_default_str();
  app.add_option("--weights", a->weights, "CPU reference weights: checkpoint (fp32) or prepared")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("--cache-blocks", a->cache_blocks,
                 "paged-cache blocks (of index_block_size tokens; 0: enough for --max-model-len)")
      ->capture_default_str();
  app.add_option("--max-model-len", a->max_model_len, "context length (conversation + answer)")->capture_default_str();
  app.add_flag("--mono", a->mono, "CUDA: the fused persistent decode path for the steps it serves");
  return [a] { return run_chat(*a); };
}

M3_COMMAND("chat", "talk with the model in the terminal (its tokenizer and chat template; thinking shown dimmed)",
           setup_chat, 25);

}  // namespace
}  // namespace m3::cli
