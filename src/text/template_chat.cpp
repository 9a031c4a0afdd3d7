#include "text/template_chat.h"

#include <fstream>
#include <sstream>

#include "text/template_json.h"

namespace m3::text {

using tmpl::TemplateError;

ChatTemplate ChatTemplate::compile(std::string_view source, const ChatTemplateOptions& options) {
  ChatTemplate t;
  t.source_ = std::make_shared<const std::string>(source);
  tmpl::LexOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  t.program_ = tmpl::parse_template(*t.source_, lex);
  t.options_ = options;
  return t;
}

std::string ChatTemplate::render_value(const tmpl::Value& context) const {
  if (!context.is_dict()) throw TemplateError(TemplateError::Kind::Render, 0, 0, "the render context must be a JSON object");
  tmpl::Renderer r(*program_, context, options_.limits);
  return r.run();
}

template <typename J>
static tmpl::Value context_value(const J& j) {
  try {
    return tmpl::from_json(j);
  } catch (const tmpl::ValueError& e) {
    throw TemplateError(TemplateError::Kind::Render, 0, 0, e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const { return render_value(context_value(context)); }
std::string ChatTemplate::render(const nlohmann::json& context) const { return render_value(context_value(context)); }

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& context) {
  return ChatTemplate::compile(source).render(context);
}

static bool read_file(const std::filesystem::path& p, std::string& out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

std::string load_chat_template_source(const std::filesystem::path& dir) {
  std::string text;
  if (read_file(dir / "chat_template.jinja", text)) return text;
  for (const char* name : {"tokenizer_config.json", "chat_template.json"}) {
    if (!read_file(dir / name, text)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw std::runtime_error((dir / name).string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("chat_template")) continue;
    const auto& ct = j["chat_template"];
    if (ct.is_string()) return ct.get<std::string>();
    if (ct.is_array()) {
      std::string names;
      for (const auto& e : ct) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          return e["template"].get<std::string>();
        if (e.is_object()) names += (names.empty() ? "" : ", ") + e.value("name", std::string("?"));
      }
      throw std::runtime_error((dir / name).string() + ": chat_template lists no template named 'default' (has: " + names + ")");
    }
    throw std::runtime_error((dir / name).string() + ": chat_template is neither a string nor a list of named templates");
  }
  throw std::runtime_error("no chat template in " + dir.string() +
                           " (looked for chat_template.jinja, tokenizer_config.json and chat_template.json with a chat_template field)");
}

}  // namespace m3::text
