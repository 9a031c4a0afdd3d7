#include "text/m3_tokens.h"

namespace m3::text {

const char* const kM3SplitPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::vector<M3AddedToken>& m3_added_tokens() {
  static const std::vector<M3AddedToken> v = [] {
    std::vector<M3AddedToken> t;
    static std::vector<std::string> names;  // storage for the generated stand-ins
    names.reserve(40);
    auto gen = [&](std::string s, bool special) {
      names.push_back(std::move(s));
      t.push_back({names.back().c_str(), special});
    };
    t.push_back({"]!p~[", true});
    for (const char* n : {"prefix", "middle", "suffix", "pad"}) gen(std::string("]<]fim ") + n + "[>[", false);
    for (int k = 0; k < 14; ++k) gen("<repo_" + std::to_string(k) + ">", false);
    for (M3AddedToken a : std::initializer_list<M3AddedToken>{
             {"]~b]", true}, {"[e~[", true}, {"]!d~[", true}, {"<function_call>", false}, {"]<]speech[>[", false},
             {"]<]end of speech[>[", false}, {"]<]image[>[", false}, {"]<]video[>[", false}, {"]<]audio[>[", false},
             {"]<]end of audio[>[", false}, {"]<]start of image[>[", false}, {"]<]end of image[>[", false},
             {"]<]start of video[>[", false}, {"]<]end of video[>[", false}, {"]<]vision pad[>[", false},
             {"]~!b[", true}})
      t.push_back(a);
    for (int k = 35; k < 50; ++k) gen("<reserved_" + std::to_string(k) + ">", true);
    for (M3AddedToken a : std::initializer_list<M3AddedToken>{
             {"<think>", false}, {"</think>", false}, {"<tool_call>", false}, {"</tool_call>", false},
             {"]<]frame[>[", false}, {"]<]start of frame[>[", false}, {"]<]end of frame[>[", false},
             {"<|content_altered_placeholder|>", true}, {"]<]minimax[>[", false}, {"<mm:think>", false},
             {"</mm:think>", false}})
      t.push_back(a);
    return t;
  }();
  return v;
}

}  // namespace m3::text
