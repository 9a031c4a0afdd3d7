#pragma once
// The renderer of the chat-template engine: runs a parsed template over a context, with jinja2's
// scoping (a for-loop body and a macro body get their own scope, if does not), default Undefined
// semantics, and bounds on output size, work and call depth so a hostile template ends in an error.
//
// Ownership: a scope owns its parent and its variables; a macro (or a call block's caller) refers to
// the scope it was defined in without owning it, since that scope usually holds the macro. The
// Renderer keeps such a scope alive while a macro defined in it can still be reached, and at the
// latest until the render ends, so closures over outer variables work for the whole render. Values
// can form cycles only through namespaces (ns.self = ns): the Renderer empties every namespace it
// made when it is destroyed. A render frees all it made (live_objects() in template_value.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/template_parser.h"
#include "text/template_value.h"

namespace m3::text::tmpl {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // all text written (macro bodies included) and every string built
  uint64_t max_steps = 20'000'000;             // statements run + loop iterations + calls; and, apart,
                                               // the list elements built in all (ElementBudget)
  int max_call_depth = 100;                    // nested macro calls
  // statements and expressions being evaluated inside each other, macro bodies included: the
  // renderer recurses on the C++ stack (a few hundred bytes a level; under ASan, a few KiB)
  int max_nesting = 1500;
};

struct Frame;

class Renderer {
 public:
  Renderer(const Program& program, Value context, const RenderLimits& limits);
  ~Renderer();
  std::string run();

  // For builtins.
  Value call(const Value& fn, CallArgs& args);
  void check_size(size_t bytes) const;
  void step();
  // namespace() registers what it makes, to be emptied when the render ends (cycles).
  void track_namespace(const NamespacePtr& ns);

 private:
  enum class Flow { Normal, Break, Continue };
  struct Scope;
  struct Nest;

  const Program& program_;
  Value context_;
  RenderLimits limits_;
  uint64_t steps_ = 0;
  size_t written_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;
  std::string* out_ = nullptr;
  std::shared_ptr<Frame> frame_;
  const std::string* block_input_ = nullptr;
  std::vector<std::shared_ptr<Frame>> kept_;       // scopes macros were defined in (macros do not own them)
  size_t sweep_at_ = 64;                           // kept_ size at which ended scopes are looked at again
  std::vector<std::weak_ptr<NamespaceData>> namespaces_;  // made by this render
  size_t prune_at_ = 64;

  Flow exec_body(const Body& body);
  Flow exec(const Node& n);
  void write(std::string_view s);
  void exec_for(const Node& n);
  void assign(const Node& n, Value v);
  Value render_block(const Body& body, const std::shared_ptr<Frame>& frame);
  Value make_macro(std::shared_ptr<const struct MacroDef> def, const std::shared_ptr<Frame>& closure);
  void leave(const std::shared_ptr<Frame>& scope);
  static bool unreachable(const Frame& scope);
  Value invoke_macro(const MacroDef& def, const std::shared_ptr<Frame>& closure, CallArgs& args);

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value lookup(const std::string& name);
  CallArgs eval_args(const Expr& e, size_t first);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
};

// obj.name / obj[key] with jinja2's lookup rules (attribute first for ".", item first for "[]").
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace m3::text::tmpl
