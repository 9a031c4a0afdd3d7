#include "text/template_render.h"

#include <algorithm>
#include <cmath>

#include "text/template_builtins.h"
#include "text/template_error.h"
#include "text/template_unicode.h"

namespace m3::text::tmpl {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  std::vector<std::weak_ptr<CallableData>> macros;  // the macros defined in this scope (they refer to it)
  bool kept = false;   // in Renderer::kept_
  bool ended = false;  // its loop iteration, block or macro call has returned
  detail::LiveMark<detail::Live::Scope> live;

  explicit Frame(std::shared_ptr<Frame> up = nullptr) : parent(std::move(up)) {}

  Value* find(const std::string& name) {
    for (auto& [k, v] : vars)
      if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    if (Value* p = find(name)) *p = std::move(v);
    else vars.emplace_back(name, std::move(v));
  }
};

Renderer::Renderer(const Program& program, Value context, const RenderLimits& limits)
    : program_(program), context_(std::move(context)), limits_(limits) {
  frame_ = std::make_shared<Frame>();
}

Renderer::~Renderer() {
  // Namespaces are the only values a template can change after making them, so every reference
  // cycle among values goes through one (ns.self = ns, ns.x = [ns]); a macro cannot close one, as
  // it does not own its scope. Emptying every namespace this render made frees them all: nothing
  // a render made outlives it but its text.
  for (auto& w : namespaces_) {
    if (NamespacePtr ns = w.lock()) {
      auto items = std::move(ns->attrs->items);
      ns->attrs->items.clear();
    }
  }
}

void Renderer::track_namespace(const NamespacePtr& ns) {
  if (namespaces_.size() >= prune_at_) {
    std::erase_if(namespaces_, [](const std::weak_ptr<NamespaceData>& w) { return w.expired(); });
    prune_at_ = std::max<size_t>(64, 2 * namespaces_.size());
  }
  namespaces_.push_back(ns);
}

std::string Renderer::run() {
  std::string out;
  out_ = &out;
  PrintBudget budget(limits_.max_output_bytes);  // no str / repr / tojson longer than the output may be
  ElementBudget elements(limits_.max_steps);     // nor more list elements built than steps allowed
  exec_body(program_.body);
  return out;
}

void Renderer::step() {
  if (++steps_ > limits_.max_steps)
    throw ValueError("render limit: more than " + std::to_string(limits_.max_steps) + " steps (loop iterations, statements, calls)");
}

void Renderer::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    throw ValueError("render limit: a string or the output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
}

void Renderer::write(std::string_view s) {
  written_ += s.size();
  check_size(written_);
  out_->append(s);
}

static TemplateError to_template_error(const ValueError& e, int line, int col) {
  std::string msg = e.what();
  TemplateError::Kind k = e.raised() ? TemplateError::Kind::Raised
                          : msg.rfind("render limit:", 0) == 0 ? TemplateError::Kind::Limit
                                                                : TemplateError::Kind::Render;
  return TemplateError(k, line, col, msg);
}

Renderer::Flow Renderer::exec_body(const Body& body) {
  for (const auto& n : body) {
    Flow f = exec(*n);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

// One level of the renderer's recursion (a statement or an expression being evaluated).
struct Renderer::Nest {
  int& n;
  Nest(int& nesting, int max) : n(nesting) {
    if (++n > max) {
      --n;
      throw ValueError("render limit: statements, expressions and macro calls nested deeper than " + std::to_string(max) +
                       " levels");
    }
  }
  ~Nest() { --n; }
};

Renderer::Flow Renderer::exec(const Node& n) {
  try {
    Nest nest(nesting_, limits_.max_nesting);
    step();
    switch (n.kind) {
      case Node::Kind::Text: write(n.text); break;
      case Node::Kind::Output: {
        Value v = eval(*n.expr);
        if (v.is_string()) write(v.str());
        else write(to_str(v));
        break;
      }
      case Node::Kind::If: {
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) return exec_body(body);
        }
        return exec_body(n.else_body);
      }
      case Node::Kind::For: exec_for(n); break;
      case Node::Kind::Set: assign(n, eval(*n.expr)); break;
      case Node::Kind::SetBlock: {
        Value body = render_block(n.body, std::make_shared<Frame>(frame_));
        if (n.filters) {
          const std::string* saved = block_input_;
          block_input_ = &body.str();
          Value filtered = eval(*n.filters);
          block_input_ = saved;
          body = std::move(filtered);
        }
        assign(n, std::move(body));
        break;
      }
      case Node::Kind::Macro: frame_->set(n.macro->name, make_macro(n.macro, frame_)); break;
      case Node::Kind::CallBlock: {
        const Expr& call = *n.expr;
        Value fn = eval(*call.args[0]);
        CallArgs args = eval_args(call, 1);
        args.kw.emplace_back("caller", make_macro(n.macro, frame_));
        Value v = this->call(fn, args);
        write(to_str(v));
        break;
      }
      case Node::Kind::FilterBlock: {
        Value body = render_block(n.body, std::make_shared<Frame>(frame_));
        const std::string* saved = block_input_;
        block_input_ = &body.str();
        Value filtered = eval(*n.filters);
        block_input_ = saved;
        write(to_str(filtered));
        break;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Generation: return exec_body(n.body);
    }
  } catch (const ValueError& e) {
    throw to_template_error(e, n.line, n.column);
  }
  return Flow::Normal;
}

Value Renderer::render_block(const Body& body, const std::shared_ptr<Frame>& frame) {
  std::string buf;
  std::string* saved_out = out_;
  auto saved_frame = frame_;
  out_ = &buf;
  frame_ = frame;
  struct Restore {
    Renderer& r;
    std::string* o;
    std::shared_ptr<Frame> f;
    ~Restore() { r.out_ = o; r.frame_ = f; }
  } restore{*this, saved_out, saved_frame};
  // A block set / filter body shares its enclosing scope in jinja2 for reads; writes stay inside.
  exec_body(body);
  leave(frame);
  return Value(std::move(buf));
}

static void bind_targets(Frame& f, const Node& n, const Value& item) {
  if (!n.unpack) {
    f.set(n.targets[0], item);
    return;
  }
  std::vector<Value> parts = iterate(item);
  if (parts.size() != n.targets.size())
    throw ValueError(parts.size() < n.targets.size()
                         ? "not enough values to unpack (expected " + std::to_string(n.targets.size()) + ", got " + std::to_string(parts.size()) + ")"
                         : "too many values to unpack (expected " + std::to_string(n.targets.size()) + ")");
  for (size_t i = 0; i < parts.size(); ++i) f.set(n.targets[i], parts[i]);
}

void Renderer::assign(const Node& n, Value v) {
  if (!n.attr.empty()) {
    Value target = lookup(n.targets[0]);
    if (!target.is_namespace())
      throw ValueError("cannot assign attribute '" + n.attr + "' on '" + n.targets[0] + "': not a namespace object");
    target.ns_ptr()->attrs->set(n.attr, std::move(v));
    return;
  }
  bind_targets(*frame_, n, v);
}

void Renderer::exec_for(const Node& n) {
  Value seq = eval(*n.expr);
  if (seq.is_none()) throw ValueError("'NoneType' object is not iterable");
  std::vector<Value> items = iterate(seq);
  if (n.cond) {
    std::vector<Value> kept;
    auto saved = frame_;
    for (auto& it : items) {
      step();
      frame_ = std::make_shared<Frame>(saved);
      bind_targets(*frame_, n, it);
      bool keep = false;
      try {
        keep = truthy(eval(*n.cond));
      } catch (...) {
        frame_ = saved;
        throw;
      }
      frame_ = saved;
      if (keep) kept.push_back(std::move(it));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec_body(n.else_body);
    return;
  }
  auto saved = frame_;
  struct Restore {
    Renderer& r;
    std::shared_ptr<Frame> f;
    ~Restore() { r.frame_ = f; }
  } restore{*this, saved};
  int64_t len = static_cast<int64_t>(items.size());
  auto cycle = [](int64_t index0) {
    return Value::callable("loop.cycle", [index0](CallArgs& a, Renderer&) -> Value {
      if (a.pos.empty()) throw ValueError("no items for cycling given");
      return a.pos[static_cast<size_t>(index0 % static_cast<int64_t>(a.pos.size()))];
    });
  };
  for (int64_t i = 0; i < len; ++i) {
    step();
    frame_ = std::make_shared<Frame>(saved);
    auto loop = std::make_shared<DictData>();
    loop->items.reserve(12);
    loop->items.emplace_back("index", Value(i + 1));
    loop->items.emplace_back("index0", Value(i));
    loop->items.emplace_back("revindex", Value(len - i));
    loop->items.emplace_back("revindex0", Value(len - i - 1));
    loop->items.emplace_back("first", Value(i == 0));
    loop->items.emplace_back("last", Value(i == len - 1));
    loop->items.emplace_back("length", Value(len));
    loop->items.emplace_back("depth", Value(1));
    loop->items.emplace_back("depth0", Value(0));
    loop->items.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop->items.emplace_back("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop->items.emplace_back("cycle", cycle(i));
    frame_->set("loop", Value(std::move(loop)));
    bind_targets(*frame_, n, items[static_cast<size_t>(i)]);
    Flow f = exec_body(n.body);
    leave(frame_);
    if (f == Flow::Break) break;
  }
}

Value Renderer::make_macro(std::shared_ptr<const MacroDef> def, const std::shared_ptr<Frame>& closure) {
  // The macro refers to its scope weakly: the scope holds the macro (and, through namespaces, may
  // hold every value), so an owning reference would be a cycle that is never freed.
  std::weak_ptr<Frame> scope = closure;
  Value fn = Value::callable(def->name, [def, scope](CallArgs& args, Renderer& r) -> Value {
    std::shared_ptr<Frame> closure = scope.lock();
    if (!closure) throw ValueError("macro '" + def->name + "' called after the render that defined it ended");
    return r.invoke_macro(*def, closure, args);
  });
  closure->macros.push_back(fn.callable_ptr());
  if (!closure->kept) {
    closure->kept = true;
    kept_.push_back(closure);
    if (kept_.size() >= sweep_at_) {  // scopes whose macros were reachable when they ended may not be now
      std::erase_if(kept_, [](const std::shared_ptr<Frame>& f) {
        if (!f->ended || !unreachable(*f)) return false;
        f->kept = false;
        return true;
      });
      sweep_at_ = std::max<size_t>(64, 2 * kept_.size());
    }
  }
  return fn;
}

// True when nothing outside the scope refers to a macro defined in it (the scope's own variables
// aside): then the render need not keep it; it goes with its last owner.
bool Renderer::unreachable(const Frame& f) {
  for (const auto& w : f.macros) {
    CallablePtr m = w.lock();
    if (!m) continue;
    long inside = 1;  // the lock just taken
    for (const auto& [k, v] : f.vars)
      if (v.is_callable() && v.callable_ptr() == m) ++inside;
    if (m.use_count() > inside) return false;
  }
  return true;
}

// A scope's loop iteration, block or macro call returned: stop keeping it unless a macro defined in
// it is still reachable (say, stored in a namespace; a later sweep looks again). So a macro or call
// block inside a loop costs no memory per iteration.
void Renderer::leave(const std::shared_ptr<Frame>& f) {
  f->ended = true;
  if (!f->kept || !unreachable(*f)) return;
  f->kept = false;
  for (size_t i = kept_.size(); i-- > 0;) {
    if (kept_[i] == f) {
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
}

Value Renderer::invoke_macro(const MacroDef& def, const std::shared_ptr<Frame>& closure, CallArgs& args) {
  step();
  if (call_depth_ >= limits_.max_call_depth)
    throw ValueError("render limit: macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
  auto frame = std::make_shared<Frame>(closure);
  size_t np = def.params.size();
  // Extra positional arguments go to varargs, unknown keywords to kwargs (jinja2 accepts them
  // only when the body names varargs / kwargs; we accept them always).
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.pos.size(); ++i) {
    if (i < np) frame->set(def.params[i].first, args.pos[i]);
    else varargs.push_back(args.pos[i]);
  }
  auto kwargs = std::make_shared<DictData>();
  Value caller;
  for (auto& [k, v] : args.kw) {
    bool is_param = false;
    for (size_t i = 0; i < np; ++i) {
      if (def.params[i].first == k) {
        if (i < args.pos.size()) throw ValueError("macro '" + def.name + "' got multiple values for argument '" + k + "'");
        frame->set(k, v);
        is_param = true;
      }
    }
    if (is_param) continue;
    if (k == "caller") caller = v;
    else kwargs->set(k, v);
  }
  ++call_depth_;
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } depth{call_depth_};
  // Defaults are evaluated in the macro's scope, left to right.
  auto saved = frame_;
  frame_ = frame;
  try {
    for (size_t i = args.pos.size(); i < np; ++i) {
      const auto& [name, def_expr] = def.params[i];
      if (frame->find(name)) continue;
      if (def_expr) frame->set(name, eval(*def_expr));
      else frame->set(name, Value::undefined("parameter '" + name + "' was not provided"));
    }
  } catch (...) {
    frame_ = saved;
    throw;
  }
  frame_ = saved;
  frame->set("varargs", Value::list(std::move(varargs), true));
  frame->set("kwargs", Value(kwargs));
  if (!caller.is_undefined()) frame->set("caller", caller);
  return render_block(def.body, frame);
}

Value Renderer::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (!fn.is_callable()) throw ValueError("'" + type_name(fn) + "' object is not callable");
  return fn.callable_ptr()->fn(args, *this);
}

Value Renderer::lookup(const std::string& name) {
  for (Frame* f = frame_.get(); f; f = f->parent.get())
    if (Value* v = f->find(name)) return *v;
  if (context_.is_dict())
    if (const Value* v = context_.dict_ptr()->find(name)) return *v;
  if (auto g = get_global(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

CallArgs Renderer::eval_args(const Expr& e, size_t first) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
  return a;
}

Value Renderer::eval(const Expr& e) {
  try {
    Nest nest(nesting_, limits_.max_nesting);
    return eval_inner(e);
  } catch (const ValueError& err) {
    throw to_template_error(err, e.line, e.column);
  }
}

Value Renderer::eval_inner(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Const: return e.value;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::Dict: {
      auto d = std::make_shared<DictData>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        if (!k.is_string()) throw ValueError("unsupported: dict literal keys must be strings (got " + type_name(k) + ")");
        d->set(k.str(), eval(*e.args[i + 1]));
      }
      return Value(std::move(d));
    }
    case Expr::Kind::Attr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::Item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
    case Expr::Kind::Slice: {
      Value obj = eval(*e.args[0]);
      Value parts[3];
      for (int i = 0; i < 3; ++i) parts[i] = e.args[i + 1] ? eval(*e.args[i + 1]) : Value(nullptr);
      return slice(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::Call: {
      Value fn = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      step();
      return call(fn, args);
    }
    case Expr::Kind::Filter: {
      Value subject = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      return apply_filter(*this, e.name, std::move(subject), args);
    }
    case Expr::Kind::Test: {
      Value subject = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      bool r = apply_test(*this, e.name, subject, args);
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.args[0]);
      if (v.is_undefined()) fail_undefined(v);
      bool neg = e.kind == Expr::Kind::Neg;
      if (v.is_bool() || v.is_int()) {
        int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
        if (neg && x == INT64_MIN) throw ValueError("integer overflow");
        return Value(neg ? -x : x);
      }
      if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
      throw ValueError(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
    }
    case Expr::Kind::Not: return Value(!truthy(eval(*e.args[0])));
    case Expr::Kind::And: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    case Expr::Kind::Cond: {
      if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    case Expr::Kind::Binary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]));
    case Expr::Kind::Compare: {
      Value left = eval(*e.args[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1]);
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::BlockInput: return block_input_ ? Value(*block_input_) : Value(std::string());
  }
  return Value();
}

static bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (item.is_undefined()) fail_undefined(item);
      if (!item.is_string()) throw ValueError("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& v : container.list_ptr()->items)
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      if (!item.is_string()) return false;
      return container.dict_ptr()->find(item.str()) != nullptr;
    default: throw ValueError("argument of type '" + type_name(container) + "' is not iterable");
  }
}

bool Renderer::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return less(a, b) || equals(a, b);
  if (op == ">=") return less(b, a) || equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  throw ValueError("unknown comparison " + op);
}

static bool as_number(const Value& v, bool& is_int, int64_t& i, double& d) {
  if (v.is_bool()) { is_int = true; i = v.as_bool(); d = static_cast<double>(i); return true; }
  if (v.is_int()) { is_int = true; i = v.as_int(); d = static_cast<double>(i); return true; }
  if (v.is_float()) { is_int = false; d = v.as_float(); return true; }
  return false;
}

static double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

Value Renderer::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a);
    s += to_str(b);
    check_size(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool ai, bi;
  int64_t xa = 0, xb = 0;
  double da = 0, db = 0;
  auto type_err = [&]() -> ValueError {
    return ValueError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (as_number(a, ai, xa, da) && as_number(b, bi, xb, db)) {
    bool ints = ai && bi;
    int64_t r;
    if (op == "+") {
      if (ints) { if (__builtin_add_overflow(xa, xb, &r)) throw ValueError("integer overflow"); return Value(r); }
      return Value(da + db);
    }
    if (op == "-") {
      if (ints) { if (__builtin_sub_overflow(xa, xb, &r)) throw ValueError("integer overflow"); return Value(r); }
      return Value(da - db);
    }
    if (op == "*") {
      if (ints) { if (__builtin_mul_overflow(xa, xb, &r)) throw ValueError("integer overflow"); return Value(r); }
      return Value(da * db);
    }
    if (op == "/") {
      if (db == 0) throw ValueError("division by zero");
      return Value(da / db);
    }
    if (op == "//") {
      if (ints) {
        if (xb == 0) throw ValueError("integer division or modulo by zero");
        if (xa == INT64_MIN && xb == -1) throw ValueError("integer overflow");
        int64_t q = xa / xb;
        if ((xa % xb != 0) && ((xa < 0) != (xb < 0))) --q;
        return Value(q);
      }
      if (db == 0) throw ValueError("float floor division by zero");
      return Value(std::floor(da / db));
    }
    if (op == "%") {
      if (ints) {
        if (xb == 0) throw ValueError("integer division or modulo by zero");
        if (xb == -1) return Value(int64_t{0});
        int64_t m = xa % xb;
        if (m != 0 && ((m < 0) != (xb < 0))) m += xb;
        return Value(m);
      }
      if (db == 0) throw ValueError("float modulo");
      return Value(py_fmod(da, db));
    }
    if (op == "**") {
      if (ints && xb >= 0) {
        int64_t result = 1, base = xa;
        int64_t e = xb;
        while (e > 0) {
          if (e & 1) { if (__builtin_mul_overflow(result, base, &result)) throw ValueError("integer overflow"); }
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) throw ValueError("integer overflow");
        }
        return Value(result);
      }
      if (da == 0 && db < 0) throw ValueError("0.0 cannot be raised to a negative power");
      return Value(std::pow(da, db));
    }
    throw type_err();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.list_ptr()->tuple == b.list_ptr()->tuple) {
      check_elements(uint64_t(a.list_ptr()->items.size()) + b.list_ptr()->items.size());  // before copying
      std::vector<Value> items = a.list_ptr()->items;
      items.insert(items.end(), b.list_ptr()->items.begin(), b.list_ptr()->items.end());
      return Value::list(std::move(items), a.list_ptr()->tuple);
    }
    throw type_err();
  }
  if (op == "*") {
    const Value* seq = nullptr;
    int64_t n = 0;
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) { seq = &a; n = b.is_int() ? b.as_int() : b.as_bool(); }
    else if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) { seq = &b; n = a.is_int() ? a.as_int() : a.as_bool(); }
    if (!seq) throw type_err();
    if (n < 0) n = 0;
    // an empty sequence repeated is empty however often (no loop of n rounds: fuzz_chat_template,
    // `[] * 3**20` ran 3.5 billion empty rounds); a count past what the limit allows fails before
    // its size is multiplied (the product could wrap)
    if (seq->is_string()) {
      const std::string& str = seq->str();
      if (str.empty() || n == 0) return Value(std::string());
      if (static_cast<uint64_t>(n) > limits_.max_output_bytes / str.size()) check_size(limits_.max_output_bytes + 1);
      check_size(str.size() * static_cast<size_t>(n));
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += str;
      return Value(std::move(s));
    }
    const auto& items = seq->list_ptr()->items;
    if (items.empty() || n == 0) return Value::list({}, seq->list_ptr()->tuple);
    if (static_cast<uint64_t>(n) > limits_.max_output_bytes / items.size()) check_size(limits_.max_output_bytes + 1);
    check_elements(static_cast<uint64_t>(n) * items.size());  // before building it
    std::vector<Value> out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
    return Value::list(std::move(out), seq->list_ptr()->tuple);
  }
  throw type_err();
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_namespace()) {
    if (const Value* v = obj.ns_ptr()->attrs->find(name)) return *v;
    return Value::undefined("'Namespace' object has no attribute '" + name + "'");
  }
  if (auto m = get_method(obj, name)) return *m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ptr()->find(name)) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

static bool int_key(const Value& k, int64_t& i) {
  if (k.is_int()) { i = k.as_int(); return true; }
  if (k.is_bool()) { i = k.as_bool(); return true; }
  return false;
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  int64_t i;
  if (obj.is_list() && int_key(key, i)) {
    const auto& items = obj.list_ptr()->items;
    int64_t n = static_cast<int64_t>(items.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("'" + type_name(obj) + " object' has no element " + to_str(key));
    return items[static_cast<size_t>(i)];
  }
  if (obj.is_string() && int_key(key, i)) {
    std::u32string u = utf8_decode(obj.str());
    int64_t n = static_cast<int64_t>(u.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("'str object' has no element " + to_str(key));
    std::string s;
    utf8_append(s, u[static_cast<size_t>(i)]);
    return Value(std::move(s));
  }
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_ptr()->find(key.str())) return *v;
    }
  }
  if (key.is_string()) {
    Value v = get_attr(obj, key.str());
    return v;
  }
  if (key.is_undefined()) fail_undefined(key);
  return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return to_index(v, what);
  };
  std::optional<int64_t> b = opt(start, "slice start"), e = opt(stop, "slice stop"), s = opt(step, "slice step");
  int64_t st = s.value_or(1);
  if (st == 0) throw ValueError("slice step cannot be zero");
  auto pick = [&](int64_t n, std::vector<int64_t>& idx) {
    int64_t lo, hi;
    if (st > 0) {
      lo = b ? (*b < 0 ? std::max<int64_t>(*b + n, 0) : std::min(*b, n)) : 0;
      hi = e ? (*e < 0 ? std::max<int64_t>(*e + n, 0) : std::min(*e, n)) : n;
      for (int64_t k = lo; k < hi; k += st) idx.push_back(k);
    } else {
      lo = b ? (*b < 0 ? std::max<int64_t>(*b + n, -1) : std::min(*b, n - 1)) : n - 1;
      hi = e ? (*e < 0 ? std::max<int64_t>(*e + n, -1) : std::min(*e, n - 1)) : -1;
      for (int64_t k = lo; k > hi; k += st) idx.push_back(k);
    }
  };
  std::vector<int64_t> idx;
  if (obj.is_string()) {
    std::u32string u = utf8_decode(obj.str());
    pick(static_cast<int64_t>(u.size()), idx);
    std::u32string r;
    for (int64_t k : idx) r.push_back(u[static_cast<size_t>(k)]);
    return Value(utf8_encode(r));
  }
  if (obj.is_list()) {
    const auto& items = obj.list_ptr()->items;
    pick(static_cast<int64_t>(items.size()), idx);
    std::vector<Value> r;
    for (int64_t k : idx) r.push_back(items[static_cast<size_t>(k)]);
    return Value::list(std::move(r), obj.list_ptr()->tuple);
  }
  return Value::undefined("'" + type_name(obj) + " object' is not subscriptable");
}

}  // namespace m3::text::tmpl
