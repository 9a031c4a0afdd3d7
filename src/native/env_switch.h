// A plan-building switch that is on unless the environment sets VAR=0 (read once, for side-by-side
// measurements of one binary), with an override for tests: set(0) off, set(1) on, set(-1) back to
// the environment's. Switches of the same bits, e.g. M3_FUSED_NORMS and M3_SPLIT_ACT.
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace m3::native {

class EnvSwitch {
 public:
  explicit EnvSwitch(const char* var) : var_(var) {}
  bool on() const {
    const int o = override_.load();
    if (o >= 0) return o != 0;
    if (env_ < 0) {
      const char* e = std::getenv(var_);
      env_ = e && std::strcmp(e, "0") == 0 ? 0 : 1;
    }
    return env_ != 0;
  }
  void set(int on) { override_.store(on < 0 ? -1 : on != 0 ? 1 : 0); }

 private:
  const char* var_;
  mutable std::atomic<int> env_{-1};
  std::atomic<int> override_{-1};
};

}  // namespace m3::native
