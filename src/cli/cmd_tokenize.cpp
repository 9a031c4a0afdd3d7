// `m3mono tokenize --model DIR (--text STR | --text-file F) [--no-special-tokens]`: the
// checkpoint's tokenizer.json (text/tokenizer.h) encodes the text; prints {"ids": [...]}.
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
  std::string model, text, text_file;
  bool no_special = false;
};

int run_tokenize(const TokenizeArgs& a, bool have_text) {
  M3_CHECK(have_text != !a.text_file.empty(), "tokenize: give exactly one of --text and --text-file");
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
  t->excludes(f);
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
