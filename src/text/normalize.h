// The normalizer of a tokenizer.json: null, NFC, NFD, NFKC, NFKD, or a Sequence of them (Unicode
// normalization by utf8proc). Any other type is a load error naming the field.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3::text {

class Normalizer {
 public:
  enum class Form { NFC, NFD, NFKC, NFKD };
  // `field` names the JSON path in errors ("normalizer", "normalizer.normalizers[1]").
  static Normalizer from_json(const nlohmann::json& j, const std::string& field = "normalizer");
  bool empty() const { return forms_.empty(); }
  std::string apply(std::string_view s) const;

 private:
  void add(const nlohmann::json& j, const std::string& field);
  std::vector<Form> forms_;
};

}  // namespace m3::text
