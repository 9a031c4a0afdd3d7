// The lifecycle of a mono runtime (plain C++; CPU-tested transition by transition):
//   Unbound --bind(caches)--> Bound --first eager decode step--> Ready (tables built: never during
//   a graph capture) --fault--> Broken; bind again (new caches: a new cache generation) from any
//   state but Closed --> Bound with no tables; close() --> Closed, idempotent, from any state.
// Graphs that captured the runtime's launches are destroyed by their owner before close().
#pragma once
#include <cstdint>
#include <string>

namespace m3::mono {

enum class State : uint8_t { Unbound, Bound, Ready, Broken, Closed };
const char* state_name(State s);

class Lifecycle {
 public:
  State state() const { return s_; }
  uint64_t generation() const { return gen_; }  // bumps on every bind
  const std::string& broken_reason() const { return why_; }

  // New caches (the first binding or a rebinding): tables of the old ones must be dropped.
  void bind();
  // May the step run through mono (returns "" or why not: "unbound", "broken", "closed")?
  std::string usable() const;
  // Building the tables at the first step: refused while a graph is being captured.
  void ready(bool capturing);
  void fail(std::string why);
  void close() { s_ = State::Closed; }

 private:
  State s_ = State::Unbound;
  uint64_t gen_ = 0;
  std::string why_;
};

}  // namespace m3::mono
