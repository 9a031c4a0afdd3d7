#pragma once
// The chat-template engine's public face: compile a Hugging Face chat template (a Jinja2 subset,
// rendered as transformers' apply_chat_template renders it: trim_blocks, lstrip_blocks, tojson as
// json.dumps(ensure_ascii=False), raise_exception, strftime_now) and render it over a context
// (messages, tools, add_generation_prompt, bos_token, template kwargs such as thinking_mode, ...).
//
//   auto t = m3::text::ChatTemplate::compile(load_chat_template_source(model_dir));
//   std::string prompt = t.render(nlohmann::ordered_json{{"messages", msgs}, {"add_generation_prompt", true}});
//
// Errors are tmpl::TemplateError: at compile time for syntax errors and unsupported constructs
// (line, column, construct), at render time for runtime errors, raise_exception() (Kind::Raised:
// the template rejected its input) and render limits (Kind::Limit).
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "text/template_error.h"
#include "text/template_render.h"

namespace m3::text {

struct ChatTemplateOptions {
  tmpl::RenderLimits limits;
  // jinja2 Environment settings; transformers uses both. Only tests change them.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

class ChatTemplate {
 public:
  static ChatTemplate compile(std::string_view source, const ChatTemplateOptions& options = {});

  // The context must be a JSON object; ordered_json keeps key order as Python would see it (this
  // matters for tojson of tool schemas), plain json has sorted keys.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const tmpl::Program> program_;
  ChatTemplateOptions options_;
  std::string render_value(const tmpl::Value& context) const;
};

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& context);

// The chat template of a checkpoint directory: chat_template.jinja, else the "chat_template" of
// tokenizer_config.json (a string, or the entry named "default" of a list of named templates),
// else chat_template.json's "chat_template". Throws std::runtime_error naming what was looked at.
std::string load_chat_template_source(const std::filesystem::path& model_dir);

}  // namespace m3::text
