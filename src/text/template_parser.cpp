#include "text/template_parser.h"

#include <set>

#include "text/template_builtins.h"
#include "text/template_error.h"

namespace m3::text::tmpl {
namespace {

using T = Token::Type;

constexpr int kMaxNesting = 200;  // expression / statement nesting, so hostile input cannot overflow the stack

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::shared_ptr<const Program> run() {
    auto p = std::make_shared<Program>();
    p->body = parse_body({});
    if (cur().type != T::Eof) fail_here("unexpected tag '" + cur().value + "'");
    return p;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::set<std::string>*> name_sinks_;  // names used inside macros being parsed

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail_here("template nested too deeply (more than 200 levels)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { const Token& t = t_[i_]; if (i_ + 1 < t_.size()) ++i_; return t; }

  [[noreturn]] void fail_at(const Token& t, const std::string& msg, TemplateError::Kind k = TemplateError::Kind::Syntax) {
    throw TemplateError(k, t.line, t.column, msg);
  }
  [[noreturn]] void fail_here(const std::string& msg) { fail_at(cur(), msg); }
  [[noreturn]] void unsupported(const Token& t, const std::string& what) {
    fail_at(t, "unsupported construct: " + what, TemplateError::Kind::Unsupported);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::Eof: return "end of template";
      case T::BlockEnd: return "end of statement block";
      case T::VarEnd: return "end of print statement";
      case T::String: return "string";
      case T::Data: return "template data";
      default: return "'" + t.value + "'";
    }
  }

  bool is_op(const char* op) const { return cur().type == T::Operator && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == T::Name && cur().value == n; }
  bool skip_op(const char* op) { if (is_op(op)) { next(); return true; } return false; }
  bool skip_name(const char* n) { if (is_name(n)) { next(); return true; } return false; }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_here(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != T::Name) fail_here("expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd) fail_here("expected end of statement block, got " + describe(cur()));
    next();
  }

  ExprPtr make(Expr::Kind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  NodePtr make_node(Node::Kind k, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  // ---- statements -------------------------------------------------------------------------

  // Parses until a block whose first name is in `ends` (left current: the name after `{%`).
  Body parse_body(const std::set<std::string>& ends) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == T::Eof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          fail_at(t, "unexpected end of template: expected " + list);
        }
        return body;
      }
      if (t.type == T::Data) {
        auto n = make_node(Node::Kind::Text, t);
        n->text = t.value;
        next();
        body.push_back(std::move(n));
      } else if (t.type == T::VarBegin) {
        next();
        auto n = make_node(Node::Kind::Output, t);
        n->expr = parse_tuple(true, {});
        if (cur().type != T::VarEnd) fail_here("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(n));
      } else if (t.type == T::BlockBegin) {
        const Token& name = peek();
        if (name.type == T::Name && ends.count(name.value)) {
          next();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail_here("unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement() {
    const Token& t = cur();
    if (t.type != T::Name) fail_here("tag name expected");
    const std::string& n = t.value;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "generation") {
      next();
      auto node = make_node(Node::Kind::Generation, t);
      expect_block_end();
      node->body = parse_body({"endgeneration"});
      next();
      expect_block_end();
      return node;
    }
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail_at(t, "'" + n + "' outside of a for loop");
      next();
      auto node = make_node(n == "break" ? Node::Kind::Break : Node::Kind::Continue, t);
      expect_block_end();
      return node;
    }
    static const std::set<std::string> known_unsupported = {
        "block", "extends", "include", "import", "from", "with", "autoescape", "do", "trans", "raw"};
    if (known_unsupported.count(n)) unsupported(t, "'{% " + n + " %}' statement");
    static const std::set<std::string> end_tags = {"endfor", "endif", "else", "elif", "endset", "endmacro",
                                                   "endcall", "endfilter", "endgeneration"};
    if (end_tags.count(n)) fail_at(t, "unexpected '" + n + "' (no open block it could close)");
    fail_at(t, "unknown tag '" + n + "'", TemplateError::Kind::Unsupported);
  }

  // Assignment targets: name, tuple of names, or (with_ns) name.attr
  void parse_targets(Node& n, bool with_ns) {
    bool paren = skip_op("(");
    if (with_ns && !paren && cur().type == T::Name && peek().type == T::Operator && peek().value == "." &&
        peek(2).type == T::Name) {
      n.targets.push_back(next().value);
      next();
      n.attr = next().value;
      return;
    }
    while (true) {
      const Token& tok = cur();
      std::string name = expect_name();
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
        fail_at(tok, "cannot assign to '" + name + "'");
      n.targets.push_back(name);
      if (!skip_op(",")) break;
      n.unpack = true;
      if (paren ? is_op(")") : (is_name("in") || is_op("=") || cur().type == T::BlockEnd)) break;
    }
    if (paren) {
      n.unpack = true;
      expect_op(")");
    }
  }

  NodePtr parse_for() {
    const Token& t = next();
    auto n = make_node(Node::Kind::For, t);
    parse_targets(*n, false);
    if (!skip_name("in")) fail_here("expected 'in', got " + describe(cur()));
    n->expr = parse_tuple(false, {"recursive"});
    if (skip_name("if")) n->cond = parse_expression(true);
    if (is_name("recursive")) unsupported(cur(), "recursive for loops");
    expect_block_end();
    ++loop_depth_;
    n->body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      n->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return n;
  }

  NodePtr parse_if() {
    const Token& t = next();
    auto n = make_node(Node::Kind::If, t);
    while (true) {
      ExprPtr cond = parse_tuple(true, {});
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"});
      n->branches.emplace_back(std::move(cond), std::move(body));
      const Token& tag = next();
      if (tag.value == "elif") continue;
      if (tag.value == "else") {
        expect_block_end();
        n->else_body = parse_body({"endif"});
        next();
      }
      break;
    }
    expect_block_end();
    return n;
  }

  NodePtr parse_set() {
    const Token& t = next();
    auto n = make_node(Node::Kind::Set, t);
    parse_targets(*n, true);
    if (skip_op("=")) {
      n->expr = parse_tuple(true, {});
      expect_block_end();
      return n;
    }
    n->kind = Node::Kind::SetBlock;
    if (n->unpack) fail_at(t, "a block set assigns one name");
    if (is_op("|")) n->filters = parse_block_filters(t);
    expect_block_end();
    n->body = parse_body({"endset"});
    next();
    expect_block_end();
    return n;
  }

  ExprPtr parse_block_filters(const Token& at) {
    ExprPtr e = make(Expr::Kind::BlockInput, at);
    while (skip_op("|")) e = parse_filter(std::move(e));
    return e;
  }

  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
    expect_op("(");
    bool seen_default = false;
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      const Token& pt = cur();
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression(true);
        seen_default = true;
      } else if (seen_default) {
        fail_at(pt, "non-default argument follows default argument");
      }
      params.emplace_back(name, std::move(def));
    }
    next();
  }

  NodePtr parse_macro() {
    const Token& t = next();
    auto n = make_node(Node::Kind::Macro, t);
    n->macro = std::make_shared<MacroDef>();
    n->macro->name = expect_name();
    parse_params(n->macro->params);
    expect_block_end();
    std::set<std::string> names;
    name_sinks_.push_back(&names);
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    n->macro->body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    name_sinks_.pop_back();
    n->macro->uses_caller = names.count("caller") > 0;
    next();
    if (cur().type == T::Name && cur().value == n->macro->name) next();
    expect_block_end();
    return n;
  }

  NodePtr parse_call_block() {
    const Token& t = next();
    auto n = make_node(Node::Kind::CallBlock, t);
    n->macro = std::make_shared<MacroDef>();
    n->macro->name = "caller";
    if (is_op("(")) parse_params(n->macro->params);
    n->expr = parse_expression(true);
    if (n->expr->kind != Expr::Kind::Call) fail_at(t, "expected a call after '{% call %}'");
    expect_block_end();
    n->macro->body = parse_body({"endcall"});
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_filter_block() {
    const Token& t = next();
    auto n = make_node(Node::Kind::FilterBlock, t);
    ExprPtr e = make(Expr::Kind::BlockInput, t);
    e = parse_filter(std::move(e));
    while (skip_op("|")) e = parse_filter(std::move(e));
    n->filters = std::move(e);
    expect_block_end();
    n->body = parse_body({"endfilter"});
    next();
    expect_block_end();
    return n;
  }

  // ---- expressions ------------------------------------------------------------------------

  bool at_end_of(const std::set<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.type == T::VarEnd || t.type == T::BlockEnd || t.type == T::Eof) return true;
    if (t.type == T::Name && extra_end.count(t.value)) return true;
    return t.type == T::Operator && t.value == ")";
  }

  // Comma-separated expressions form a tuple (jinja2's parse_tuple).
  ExprPtr parse_tuple(bool with_condexpr, const std::set<std::string>& extra_end) {
    const Token& t = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
        if (at_end_of(extra_end)) break;
      }
      if (items.empty() && at_end_of(extra_end)) fail_here("expected an expression, got " + describe(cur()));
      items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) return std::move(items[0]);
    auto e = make(Expr::Kind::Tuple, t);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& t = next();
      auto c = make(Expr::Kind::Cond, t);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (skip_name("else")) c->args.push_back(parse_condexpr());
      else c->args.push_back(nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, const Token& t, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make(k, t);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& t = next();
      e = binary(Expr::Kind::Or, t, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& t = next();
      e = binary(Expr::Kind::And, t, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      const Token& t = next();
      auto e = make(Expr::Kind::Not, t);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& t = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == T::Operator && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                        cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == T::Name && peek().value == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, t);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t, std::move(e), parse_concat(), t.value);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t, std::move(e), parse_math2(), "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t, std::move(e), parse_pow(), t.value);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t, std::move(e), parse_unary(true), "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(t.value == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, t);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case T::Name: {
        next();
        const std::string& n = t.value;
        if (n == "true" || n == "True") { auto e = make(Expr::Kind::Const, t); e->value = Value(true); return e; }
        if (n == "false" || n == "False") { auto e = make(Expr::Kind::Const, t); e->value = Value(false); return e; }
        if (n == "none" || n == "None") { auto e = make(Expr::Kind::Const, t); e->value = Value(nullptr); return e; }
        for (auto* s : name_sinks_) s->insert(n);
        auto e = make(Expr::Kind::Name, t);
        e->name = n;
        return e;
      }
      case T::String: {
        std::string s = next().value;
        while (cur().type == T::String) s += next().value;
        auto e = make(Expr::Kind::Const, t);
        e->value = Value(std::move(s));
        return e;
      }
      case T::Integer: {
        next();
        auto e = make(Expr::Kind::Const, t);
        e->value = Value(parse_int(t));
        return e;
      }
      case T::Float: {
        next();
        auto e = make(Expr::Kind::Const, t);
        double d = 0;
        if (!py_parse_float(t.value, &d)) fail_here("malformed float literal '" + t.value + "'");
        e->value = Value(d);  // 1e999 is inf, as Python's float()
        return e;
      }
      case T::Operator:
        if (t.value == "(") {
          next();
          if (skip_op(")")) {
            auto e = make(Expr::Kind::Tuple, t);
            return e;
          }
          ExprPtr e = parse_tuple(true, {});
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          auto e = make(Expr::Kind::List, t);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (t.value == "{") {
          next();
          auto e = make(Expr::Kind::Dict, t);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    fail_here("unexpected " + describe(t));
  }

  int64_t parse_int(const Token& t) {
    const std::string& v = t.value;
    int base = 10;
    size_t off = 0;
    if (v.size() > 1 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) base = 16, off = 2;
    else if (v.size() > 1 && v[0] == '0' && (v[1] == 'o' || v[1] == 'O')) base = 8, off = 2;
    else if (v.size() > 1 && v[0] == '0' && (v[1] == 'b' || v[1] == 'B')) base = 2, off = 2;
    try {
      size_t used = 0;
      long long x = std::stoll(v.substr(off), &used, base);
      return x;
    } catch (const std::exception&) {
      unsupported(t, "integer literal '" + v + "' out of the 64-bit range");
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) e = parse_subscript(std::move(e));
      else if (is_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) { next(); e = parse_filter(std::move(e)); }
      else if (is_name("is")) e = parse_test(std::move(e));
      else if (is_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& a = cur();
      if (a.type == T::Name) {
        next();
        auto e = make(Expr::Kind::Attr, a);
        e->name = a.value;
        e->args.push_back(std::move(obj));
        return e;
      }
      if (a.type == T::Integer) {
        next();
        auto e = make(Expr::Kind::Item, a);
        e->args.push_back(std::move(obj));
        auto k = make(Expr::Kind::Const, a);
        k->value = Value(parse_int(a));
        e->args.push_back(std::move(k));
        return e;
      }
      fail_at(a, "expected name or number after '.'");
    }
    // [ subscript ]
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    std::vector<ExprPtr> tuple_items;
    while (true) {
      ExprPtr start, stop, step;
      bool slice = false;
      if (!is_op(":")) start = parse_expression(true);
      if (skip_op(":")) {
        slice = true;
        if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
        if (skip_op(":")) {
          if (!is_op("]") && !is_op(",")) step = parse_expression(true);
        }
      }
      if (slice) {
        if (is_op(",")) unsupported(cur(), "multi-dimensional slicing");
        auto e = make(Expr::Kind::Slice, t);
        e->args.push_back(std::move(obj));
        e->args.push_back(std::move(start));
        e->args.push_back(std::move(stop));
        e->args.push_back(std::move(step));
        expect_op("]");
        is_slice = true;
        return e;
      }
      tuple_items.push_back(std::move(start));
      if (!skip_op(",")) break;
      if (is_op("]")) break;
    }
    (void)is_slice;
    expect_op("]");
    auto e = make(Expr::Kind::Item, t);
    e->args.push_back(std::move(obj));
    if (tuple_items.size() == 1) {
      e->args.push_back(std::move(tuple_items[0]));
    } else {
      auto tup = make(Expr::Kind::Tuple, t);
      tup->args = std::move(tuple_items);
      e->args.push_back(std::move(tup));
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) unsupported(cur(), "'*args' / '**kwargs' in calls");
      if (cur().type == T::Name && peek().type == T::Operator && peek().value == "=") {
        std::string k = next().value;
        next();
        e.kwargs.emplace_back(k, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_here("positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, cur());
    e->line = callee->line;
    e->column = callee->column;
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr subject) {
    const Token& t = cur();
    std::string name = expect_name();
    while (is_op(".") && peek().type == T::Name) {
      next();
      name += "." + next().value;
    }
    if (!has_filter(name)) fail_at(t, "unsupported construct: no filter named '" + name + "'", TemplateError::Kind::Unsupported);
    auto e = make(Expr::Kind::Filter, t);
    e->name = name;
    e->args.push_back(std::move(subject));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    next();  // is
    bool negated = skip_name("not");
    const Token& t = cur();
    std::string name = expect_name();
    while (is_op(".") && peek().type == T::Name) {
      next();
      name += "." + next().value;
    }
    if (!has_test(name)) fail_at(t, "unsupported construct: no test named '" + name + "'", TemplateError::Kind::Unsupported);
    auto e = make(Expr::Kind::Test, t);
    e->name = name;
    e->negated = negated;
    e->args.push_back(std::move(subject));
    if (is_op("(")) {
      parse_call_args(*e);
    } else {
      const Token& a = cur();
      bool arg_start = a.type == T::String || a.type == T::Integer || a.type == T::Float ||
                       (a.type == T::Name && a.value != "else" && a.value != "or" && a.value != "and") ||
                       (a.type == T::Operator && (a.value == "(" || a.value == "[" || a.value == "{"));
      if (arg_start) {
        if (a.type == T::Name && a.value == "is") fail_at(a, "you cannot chain multiple tests with 'is'");
        ExprPtr arg = parse_primary();
        e->args.push_back(parse_postfix(std::move(arg)));
      }
    }
    return e;
  }
};

}  // namespace

std::shared_ptr<const Program> parse_template(std::string_view source, const LexOptions& options) {
  return Parser(tokenize(source, options)).run();
}

}  // namespace m3::text::tmpl
