// `m3mono tokenize --model DIR (--text STR | --text-file F) [--no-special-tokens]`: the
// checkpoint's tokenizer.json (text/tokenizer.h) encodes the text; prints {"ids": [...]}.
// `m3mono tokenize --model DIR --messages FILE.json [--add-generation-prompt] [--template-kwargs
// JSON]`: renders the checkpoint's chat template (text/template_chat.h) over the messages first
// and encodes the rendered text without special tokens, as transformers' apply_chat_template(...,
// tokenize=True) does.
// `m3mono detokenize --model DIR --ids 1,2,3 [--skip-special-tokens]`: prints the decoded text.
// The ids are checked against config.json's vocab_size.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "cli/int_list.h"
#include "core/check.h"
#include "model/spec.h"
#include "text/template_chat.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace m3::cli {
namespace {

text::Tokenizer load_tokenizer(const std::string& model, const char* cmd) {
  namespace fs = std::filesystem;
  M3_CHECK(!model.empty(), "{}: --model is required", cmd);
  std::error_code ec;
  M3_CHECK(fs::is_directory(model, ec), "{}: --model '{}' is not a directory", cmd, model);
  M3_CHECK(fs::exists(fs::path(model) / "tokenizer.json", ec), "{}: --model '{}' has no tokenizer.json", cmd, model);
  ModelSpec spec = load_model_spec(model);
  return text::Tokenizer::load(model, spec.vocab_size);
}

struct TokenizeArgs {
  std::string model, text, text_file, messages, template_kwargs;
  bool no_special = false;
  bool add_generation_prompt = false;
};

std::string read_whole_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "tokenize: {}: cannot open '{}'", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  M3_CHECK(!in.bad(), "tokenize: {}: error reading '{}'", flag, path);
  return ss.str();
}

// The template context: the messages (FILE.json is a list of messages, or an object with
// "messages" and optionally "tools"), add_generation_prompt, and the template kwargs.
nlohmann::ordered_json chat_context(const TokenizeArgs& a) {
  using oj = nlohmann::ordered_json;
  const std::string text = read_whole_file(a.messages, "--messages");
  oj file = oj::parse(text, nullptr, /*allow_exceptions=*/false);
  M3_CHECK(!file.is_discarded(), "tokenize: --messages '{}' is not valid JSON", a.messages);
  oj ctx = oj::object();
  if (file.is_array()) {
    ctx["messages"] = file;
  } else {
    M3_CHECK(file.is_object() && file.contains("messages"),
             "tokenize: --messages '{}' must hold a list of messages or an object with \"messages\"", a.messages);
    for (auto it = file.begin(); it != file.end(); ++it) {
      M3_CHECK(it.key() == "messages" || it.key() == "tools",
               "tokenize: --messages '{}': unknown key \"{}\" (expected \"messages\" and optionally \"tools\")",
               a.messages, it.key());
      ctx[it.key()] = it.value();
    }
  }
  M3_CHECK(ctx["messages"].is_array(), "tokenize: --messages '{}': \"messages\" must be a list", a.messages);
  for (size_t i = 0; i < ctx["messages"].size(); ++i) {
    const oj& m = ctx["messages"][i];
    M3_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
             "tokenize: --messages '{}': messages[{}] must be an object with a string \"role\"", a.messages, i);
  }
  ctx["add_generation_prompt"] = a.add_generation_prompt;
  if (!a.template_kwargs.empty()) {
    oj kw = oj::parse(a.template_kwargs, nullptr, false);
    M3_CHECK(!kw.is_discarded() && kw.is_object(), "tokenize: --template-kwargs must be a JSON object, got '{}'",
             a.template_kwargs);
    for (auto it = kw.begin(); it != kw.end(); ++it) {
      M3_CHECK(!ctx.contains(it.key()), "tokenize: --template-kwargs must not set \"{}\" (given by {})", it.key(),
               it.key() == "add_generation_prompt" ? "--add-generation-prompt" : "--messages");
      ctx[it.key()] = it.value();
    }
  }
  return ctx;
}

int run_tokenize_messages(const TokenizeArgs& a) {
  nlohmann::ordered_json ctx = chat_context(a);
  text::Tokenizer tok = load_tokenizer(a.model, "tokenize");
  std::string source;
  try {
    source = text::load_chat_template_source(a.model);
  } catch (const std::exception& e) {
    M3_FAIL("tokenize: --messages needs the checkpoint's chat template: {}", e.what());
  }
  std::string rendered;
  try {
    rendered = text::ChatTemplate::compile(source).render(ctx);
  } catch (const std::exception& e) {
    M3_FAIL("tokenize: --messages '{}': the chat template failed: {}", a.messages, e.what());
  }
  std::vector<int32_t> ids = tok.encode(rendered, /*add_special_tokens=*/false);
  std::printf("{\"ids\": [%s]}\n", fmt::format("{}", fmt::join(ids, ", ")).c_str());
  return 0;
}

int run_tokenize(const TokenizeArgs& a, bool have_text) {
  const int inputs = int(have_text) + int(!a.text_file.empty()) + int(!a.messages.empty());
  M3_CHECK(inputs == 1, "tokenize: give exactly one of --text, --text-file and --messages");
  M3_CHECK(!a.messages.empty() || (!a.add_generation_prompt && a.template_kwargs.empty()),
           "tokenize: --add-generation-prompt and --template-kwargs go with --messages");
  if (!a.messages.empty()) {
    M3_CHECK(!a.no_special, "tokenize: --no-special-tokens does not go with --messages (rendered chats are always "
                            "encoded without special tokens)");
    return run_tokenize_messages(a);
  }
  std::string input = a.text;
  std::string what = "tokenize: --text";
  if (!a.text_file.empty()) {
    std::ifstream in(a.text_file, std::ios::binary);
    M3_CHECK(in.good(), "tokenize: --text-file: cannot open '{}'", a.text_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    M3_CHECK(!in.bad(), "tokenize: --text-file: error reading '{}'", a.text_file);
    input = ss.str();
    what = "tokenize: --text-file '" + a.text_file + "'";
  }
  text::require_utf8(input, what);
  text::Tokenizer tok = load_tokenizer(a.model, "tokenize");
  std::vector<int32_t> ids = tok.encode(input, !a.no_special);
  std::printf("{\"ids\": [%s]}\n", fmt::format("{}", fmt::join(ids, ", ")).c_str());
  return 0;
}

RunFn setup_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("--model", a->model, "checkpoint directory (tokenizer.json + config.json)")->required();
  auto* t = app.add_option("--text", a->text, "the text to encode (UTF-8)");
  auto* f = app.add_option("--text-file", a->text_file, "a file whose whole contents (UTF-8) are encoded");
  auto* m = app.add_option("--messages", a->messages,
                           "a JSON file of chat messages (a list, or {\"messages\": [...], \"tools\": [...]}): "
                           "rendered with the checkpoint's chat template, then encoded without special tokens");
  t->excludes(f);
  m->excludes(t)->excludes(f);
  app.add_flag("--add-generation-prompt", a->add_generation_prompt,
               "with --messages: end with the assistant turn's opening (add_generation_prompt=True)");
  app.add_option("--template-kwargs", a->template_kwargs,
                 "with --messages: a JSON object of extra template variables, e.g. '{\"thinking_mode\": \"enabled\"}'");
  app.add_flag("--no-special-tokens", a->no_special,
               "do not apply the post-processor's special tokens (add_special_tokens=False)");
  app.footer("Prints {\"ids\": [...]} on one line. Added tokens (special or not) in the text are encoded as such.");
  return [a, t] { return run_tokenize(*a, t->count() > 0); };
}

struct DetokenizeArgs {
  std::string model, ids;
  bool skip_special = false;
};

int run_detokenize(const DetokenizeArgs& a) {
  std::vector<int32_t> ids = parse_token_ids(a.ids, "detokenize: --ids");
  text::Tokenizer tok = load_tokenizer(a.model, "detokenize");
  for (size_t i = 0; i < ids.size(); ++i)
    M3_CHECK(ids[i] < tok.vocab_size(), "detokenize: --ids entry {} ({}) is outside the vocabulary [0, {})", i, ids[i],
             tok.vocab_size());
  std::string s = tok.decode(ids, a.skip_special);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

RunFn setup_detokenize(CLI::App& app) {
  auto a = std::make_shared<DetokenizeArgs>();
  app.add_option("--model", a->model, "checkpoint directory (tokenizer.json + config.json)")->required();
  app.add_option("--ids", a->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  app.add_flag("--skip-special-tokens", a->skip_special, "leave out special added tokens (skip_special_tokens=True)");
  app.footer("Prints the decoded text followed by one newline; invalid UTF-8 from byte tokens prints as U+FFFD.");
  return [a] { return run_detokenize(*a); };
}

M3_COMMAND("tokenize", "encode text with the checkpoint's tokenizer.json; prints {\"ids\": [...]}", setup_tokenize, 64);
M3_COMMAND("detokenize", "decode token ids with the checkpoint's tokenizer.json; prints the text", setup_detokenize, 65);

}  // namespace
}  // namespace m3::cli
