#include "text/post_process.h"

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace m3::text {
namespace {

using json = nlohmann::json;

int32_t checked_id(const json& v, const std::string& field) {
  M3_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
           "tokenizer.json: {} must be a non-negative 32-bit id, not {}", field, v.dump());
  return v.get<int32_t>();
}

}  // namespace

PostProcessor PostProcessor::from_json(const json& j, const std::string& field) {
  PostProcessor p;
  if (!j.is_null()) p.add(j, field);
  return p;
}

void PostProcessor::add(const json& j, const std::string& field) {
  M3_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
           "tokenizer.json: {} must be null or an object with a \"type\"", field);
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    auto it = j.find("processors");
    M3_CHECK(it != j.end() && it->is_array(), "tokenizer.json: {}.processors must be an array", field);
    for (size_t i = 0; i < it->size(); ++i) add((*it)[i], field + ".processors[" + std::to_string(i) + "]");
    return;
  }
  Wrap w;
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* k : {"cls", "sep"}) {
      auto it = j.find(k);
      M3_CHECK(it != j.end() && it->is_array() && it->size() == 2 && (*it)[0].is_string(),
               "tokenizer.json: {}.{} must be [token, id]", field, k);
      int32_t id = checked_id((*it)[1], field + "." + k + "[1]");
      (std::string(k) == "cls" ? w.before : w.after).push_back(id);
      (std::string(k) == "cls" ? w.before_names : w.after_names).push_back((*it)[0].get<std::string>());
    }
  } else if (type == "TemplateProcessing") {
    auto single = j.find("single");
    M3_CHECK(single != j.end() && single->is_array(), "tokenizer.json: {}.single must be an array", field);
    auto specials = j.find("special_tokens");
    M3_CHECK(specials != j.end() && specials->is_object(), "tokenizer.json: {}.special_tokens must be an object",
             field);
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& piece = (*single)[i];
      std::string pf = field + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        M3_CHECK(!seen_sequence, "tokenizer.json: {}: a second Sequence in the single template", pf);
        seen_sequence = true;
        continue;
      }
      M3_CHECK(piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                   piece["SpecialToken"]["id"].is_string(),
               "tokenizer.json: {} is neither a Sequence nor a SpecialToken: {}", pf, piece.dump());
      std::string name = piece["SpecialToken"]["id"].get<std::string>();
      auto st = specials->find(name);
      M3_CHECK(st != specials->end() && st->contains("ids") && (*st)["ids"].is_array(),
               "tokenizer.json: {}: special token '{}' is not in {}.special_tokens (with ids)", pf, name, field);
      for (size_t k = 0; k < (*st)["ids"].size(); ++k) {
        int32_t id = checked_id((*st)["ids"][k], field + ".special_tokens." + name + ".ids");
        (seen_sequence ? w.after : w.before).push_back(id);
        (seen_sequence ? w.after_names : w.before_names).push_back(name);
      }
    }
    M3_CHECK(seen_sequence, "tokenizer.json: {}.single has no Sequence", field);
  } else {
    M3_FAIL("tokenizer.json: {}.type '{}' is not supported (supported: null, ByteLevel, TemplateProcessing, "
            "BertProcessing, RobertaProcessing, Sequence)", field, type);
  }
  wraps_.push_back(std::move(w));
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  for (const Wrap& w : wraps_) {
    ids.insert(ids.begin(), w.before.begin(), w.before.end());
    ids.insert(ids.end(), w.after.begin(), w.after.end());
  }
}

std::vector<std::pair<std::string, int32_t>> PostProcessor::ids() const {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const Wrap& w : wraps_) {
    for (size_t i = 0; i < w.before.size(); ++i) out.emplace_back(w.before_names[i], w.before[i]);
    for (size_t i = 0; i < w.after.size(); ++i) out.emplace_back(w.after_names[i], w.after[i]);
  }
  return out;
}

}  // namespace m3::text
