// The reasoning / answer split of MiniMax-M3's output (serve/reasoning.h).
#include "serve/reasoning.h"

#include <string>
#include <vector>

#include "serve/text_stream.h"

namespace m3::serve {

bool parse_thinking_mode(std::string_view s, ThinkingMode* out) {
  if (s == "enabled") *out = ThinkingMode::Enabled;
  else if (s == "disabled") *out = ThinkingMode::Disabled;
  else if (s == "adaptive") *out = ThinkingMode::Adaptive;
  else return false;
  return true;
}

ReasoningSplit::ReasoningSplit(ThinkingMode mode)
    : state_(mode == ThinkingMode::Enabled    ? State::Reasoning
             : mode == ThinkingMode::Disabled ? State::Content
                                              : State::Start),
      reasoned_(mode == ThinkingMode::Enabled) {}

ReasoningSplit::Out ReasoningSplit::push(std::string_view text, bool last) {
  held_ += text;
  return release(last);
}

ReasoningSplit::Out ReasoningSplit::release(bool final) {
  static const std::vector<std::string> close{std::string(kThinkClose)};
  Out o;
  for (;;) {
    switch (state_) {
      case State::Start: {
        const size_t p = held_.find_first_not_of(" \t\r\n");
        if (p == std::string::npos) {  // only whitespace so far: the opener may still come
          if (final) {
            o.content += held_;
            held_.clear();
          }
          return o;
        }
        const std::string_view rest = std::string_view(held_).substr(p);
        if (rest.starts_with(kThinkOpen)) {
          held_.erase(0, p + kThinkOpen.size());
          state_ = State::Reasoning;
          reasoned_ = true;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return o;  // may still become the opener
        state_ = State::Content;
        continue;
      }
      case State::Reasoning: {
        const size_t p = held_.find(kThinkClose);
        if (p != std::string::npos) {
          o.reasoning += held_.substr(0, p);
          held_.erase(0, p + kThinkClose.size());
          state_ = State::Content;
          continue;
        }
        const size_t keep = final ? 0 : held_back_length(held_, close);
        o.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return o;
      }
      case State::Content:
        o.content += held_;
        held_.clear();
        return o;
    }
  }
}

}  // namespace m3::serve
