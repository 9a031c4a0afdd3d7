// Lifecycle (mono/lifecycle.h).
#include "mono/lifecycle.h"

#include "core/check.h"

namespace m3::mono {

const char* state_name(State s) {
  switch (s) {
    case State::Unbound: return "unbound";
    case State::Bound: return "bound";
    case State::Ready: return "ready";
    case State::Broken: return "broken";
    case State::Closed: return "closed";
  }
  return "?";
}

void Lifecycle::bind() {
  M3_CHECK(s_ != State::Closed, "mono: bind after close (create a new runtime)");
  s_ = State::Bound;
  ++gen_;
  why_.clear();
}

std::string Lifecycle::usable() const {
  switch (s_) {
    case State::Unbound: return "unbound";
    case State::Broken: return "broken";
    case State::Closed: return "closed";
    default: return "";
  }
}

void Lifecycle::ready(bool capturing) {
  M3_CHECK(s_ == State::Bound || s_ == State::Ready, "mono: building tables in state {}", state_name(s_));
  M3_CHECK(!capturing, "mono: the first step of a cache generation must run eagerly, not inside a graph capture");
  s_ = State::Ready;
}

void Lifecycle::fail(std::string why) {
  if (s_ == State::Closed) return;
  s_ = State::Broken;
  why_ = std::move(why);
}

}  // namespace m3::mono
