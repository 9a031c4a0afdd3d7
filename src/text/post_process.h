// The post-processor of a tokenizer.json, for one sequence with add_special_tokens: null and
// ByteLevel add nothing; TemplateProcessing adds its "single" template's special tokens around the
// sequence; BertProcessing/RobertaProcessing add cls ... sep; Sequence applies its processors in
// order. Any other type is a load error naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3::text {

class PostProcessor {
 public:
  static PostProcessor from_json(const nlohmann::json& j, const std::string& field = "post_processor");
  void apply(std::vector<int32_t>& ids) const;
  // Every id the processor can add, with the name it is known by (for the vocab-size check).
  std::vector<std::pair<std::string, int32_t>> ids() const;

 private:
  struct Wrap {
    std::vector<int32_t> before, after;
    std::vector<std::string> before_names, after_names;
  };
  void add(const nlohmann::json& j, const std::string& field);
  std::vector<Wrap> wraps_;
};

}  // namespace m3::text
