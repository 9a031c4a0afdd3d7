#pragma once
// The syntax tree of a parsed chat template: expressions and statements, each with the line and
// column it starts at (for render errors).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/template_value.h"

namespace m3::text::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Const,     // value
    Name,      // name
    List,      // args
    Tuple,     // args
    Dict,      // args: key0, value0, key1, value1, ...
    Attr,      // args[0].name
    Item,      // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null parts omitted)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is [not] name(args[1..], kwargs)
    Neg, Pos, Not,
    Binary,    // args[0] op args[1]: + - * / // % ** ~
    Compare,   // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
    And, Or,
    Cond,      // args[1] if args[0] else args[2] (args[2] may be null: undefined)
    BlockInput,  // the rendered body a filter block / block set filters
  };
  Kind kind;
  int line = 0, column = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroDef {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null when required
  Body body;
  bool uses_caller = false;
};

struct Node {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches (cond, body), else_body
    For,          // targets in expr [if cond] body else_body
    Set,          // targets = expr; or attr: targets[0].attr = expr
    SetBlock,     // targets[0] = rendered body | filters
    Macro,        // macro
    CallBlock,    // {% call(params) expr %}: macro = the caller, expr = the call
    FilterBlock,  // body | filters
    Break, Continue,
    Generation,   // {% generation %}: renders its body
  };
  Kind kind;
  int line = 0, column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  bool unpack = false;  // targets written as a tuple
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::shared_ptr<MacroDef> macro;
  ExprPtr filters;  // chain of Filter exprs ending in BlockInput
};

}  // namespace m3::text::tmpl
