#include "text/normalize.h"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdlib>

#include "core/check.h"

namespace m3::text {

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& field) {
  Normalizer n;
  if (!j.is_null()) n.add(j, field);
  return n;
}

void Normalizer::add(const nlohmann::json& j, const std::string& field) {
  M3_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
           "tokenizer.json: {} must be null or an object with a \"type\"", field);
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    M3_CHECK(it != j.end() && it->is_array(), "tokenizer.json: {}.normalizers must be an array", field);
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], field + ".normalizers[" + std::to_string(i) + "]");
  } else if (type == "NFC") {
    forms_.push_back(Form::NFC);
  } else if (type == "NFD") {
    forms_.push_back(Form::NFD);
  } else if (type == "NFKC") {
    forms_.push_back(Form::NFKC);
  } else if (type == "NFKD") {
    forms_.push_back(Form::NFKD);
  } else {
    M3_FAIL("tokenizer.json: {}.type '{}' is not supported (supported: null, NFC, NFD, NFKC, NFKD, Sequence)", field,
            type);
  }
}

std::string Normalizer::apply(std::string_view s) const {
  std::string cur(s);
  for (Form f : forms_) {
    int opt = UTF8PROC_STABLE;
    switch (f) {
      case Form::NFC: opt |= UTF8PROC_COMPOSE; break;
      case Form::NFD: opt |= UTF8PROC_DECOMPOSE; break;
      case Form::NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case Form::NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()),
                                      utf8proc_ssize_t(cur.size()), &dst, utf8proc_option_t(opt));
    M3_CHECK(n >= 0, "normalizer: {}", utf8proc_errmsg(n));
    cur.assign(reinterpret_cast<const char*>(dst), size_t(n));
    std::free(dst);
  }
  return cur;
}

}  // namespace m3::text
