// Environment switches of the same bits, for side-by-side measurements of one binary:
//   EnvSwitch: on unless the environment sets VAR=0 (M3_FUSED_NORMS, M3_SPLIT_ACT), or off unless it
//   sets VAR to another value (the measured-slower M3_ROPE_LAST, M3_COMBINE_LAST), with an
//   override for tests: set(0) off, set(1) on, set(-1) back to the environment's;
//   env_choice: which of a few named values VAR holds (M3_MMA_WALK, M3_MOE_WALK).
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "core/check.h"

namespace m3::native {

class EnvSwitch {
 public:
  // dflt: the value when VAR is unset (VAR=0 turns it off, any other value on)
  explicit EnvSwitch(const char* var, bool dflt = true) : var_(var), dflt_(dflt) {}
  bool on() const {
    const int o = override_.load();
    if (o >= 0) return o != 0;
    if (env_ < 0) {
      const char* e = std::getenv(var_);
      env_ = !e || !*e ? (dflt_ ? 1 : 0) : std::strcmp(e, "0") == 0 ? 0 : 1;
    }
    return env_ != 0;
  }
  void set(int on) { override_.store(on < 0 ? -1 : on != 0 ? 1 : 0); }

 private:
  const char* var_;
  bool dflt_;
  mutable std::atomic<int> env_{-1};
  std::atomic<int> override_{-1};
};

// The index in `names` of VAR's value, or of `dflt` when VAR is unset; any other value is an error
// naming VAR and the values it takes.
inline int env_choice(const char* var, std::initializer_list<const char*> names, const char* dflt) {
  const char* e = std::getenv(var);
  const std::string v = e ? e : dflt;
  std::string known;
  int i = 0;
  for (const char* n : names) {
    if (v == n) return i;
    known += (i++ ? ", " : "") + std::string(n);
  }
  M3_FAIL("{}={}: not one of {}", var, v, known);
}

}  // namespace m3::native
