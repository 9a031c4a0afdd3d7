// MiniMax-M3's tokenizer layout as the synthetic (make-tiny) tokenizer copies it: the o200k-style
// split pattern and the 61 added tokens (ids 200000..200060 in the checkpoint, in this order).
// Names documented in shared/docs/ecosystem-notes.md are M3's; the others are stand-ins of the same
// shape (the real file is the authority: a checkpoint's own tokenizer.json is always loaded as is).
#pragma once
#include <string>
#include <vector>

namespace m3::text {

extern const char* const kM3SplitPattern;

struct M3AddedToken {
  const char* content;
  bool special;
};
const std::vector<M3AddedToken>& m3_added_tokens();

}  // namespace m3::text
