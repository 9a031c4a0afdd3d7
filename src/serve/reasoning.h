// MiniMax-M3's thinking, split from its answer: the model writes `<mm:think>reasoning</mm:think>answer`
// (the markers are added tokens, but a model may also spell them in smaller pieces, so the split
// works on the decoded text, not on ids). The chat template prefills the opener when the request's
// `chat_template_kwargs.thinking_mode` is "enabled" and the closer when it is "disabled"; "adaptive"
// (the default) leaves the choice to the model. So the split starts
//   enabled:  inside the reasoning (until `</mm:think>`, the rest is the answer);
//   disabled: in the answer (everything is content, markers included);
//   adaptive: undecided: text that opens with `<mm:think>` (after optional whitespace, dropped) is
//             reasoning until `</mm:think>`; any other text makes everything content.
// The state follows the request's mode, never a scan of the prompt (a prompt may quote markers).
// Text is pushed as it is released (after stop strings); text that may still be the start of a
// marker is held back until it cannot be, so a marker split across chunks never leaks; the
// markers themselves are dropped. finish() releases what is held.
#pragma once
#include <string>
#include <string_view>

namespace m3::serve {

enum class ThinkingMode { Enabled, Disabled, Adaptive };

// "enabled", "disabled", "adaptive"; anything else is nullopt's stand-in: false.
bool parse_thinking_mode(std::string_view s, ThinkingMode* out);

class ReasoningSplit {
 public:
  explicit ReasoningSplit(ThinkingMode mode);

  struct Out {
    std::string reasoning, content;
  };
  // last: the text ends with this piece (what is held back comes out too)
  Out push(std::string_view text, bool last = false);
  Out finish() { return push({}, true); }
  // Whether any reasoning was seen (opened, or the mode started inside it).
  bool reasoned() const { return reasoned_; }

 private:
  enum class State { Start, Reasoning, Content };
  Out release(bool final);

  State state_;
  std::string held_;
  bool reasoned_ = false;
};

inline constexpr std::string_view kThinkOpen = "<mm:think>";
inline constexpr std::string_view kThinkClose = "</mm:think>";

}  // namespace m3::serve
