#include "pointwise_expr.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "kiln/pointwise.h"

namespace kiln {

ExpressionError::ExpressionError(const std::string& op, const std::string& what, int column,
                                 const std::string& expression)
    : CompileError(op, "", what, expression, ""),
      message_("[" + op + "] " + what + " at column " + std::to_string(column) + " in \"" + expression + "\""),
      expression_(expression),
      column_(column) {}

namespace expr {

namespace {

struct FnInfo {
  const char* name;
  Fn fn;
  int arity;
};

constexpr FnInfo kFunctions[] = {
    {"exp", Fn::exp, 1},         {"log", Fn::log, 1},         {"log1p", Fn::log1p, 1},
    {"expm1", Fn::expm1, 1},     {"sqrt", Fn::sqrt, 1},       {"rsqrt", Fn::rsqrt, 1},
    {"sin", Fn::sin, 1},         {"cos", Fn::cos, 1},         {"tanh", Fn::tanh, 1},
    {"erf", Fn::erf, 1},         {"floor", Fn::floor, 1},     {"ceil", Fn::ceil, 1},
    {"rint", Fn::rint, 1},       {"abs", Fn::abs, 1},         {"sign", Fn::sign, 1},
    {"relu", Fn::relu, 1},       {"sigmoid", Fn::sigmoid, 1}, {"silu", Fn::silu, 1},
    {"gelu", Fn::gelu, 1},       {"softplus", Fn::softplus, 1}, {"pow", Fn::pow, 2},
    {"maximum", Fn::maximum, 2}, {"minimum", Fn::minimum, 2},
};

const FnInfo* find_function(std::string_view name) {
  for (const FnInfo& f : kFunctions)
    if (name == f.name) return &f;
  return nullptr;
}

const FnInfo& info(Fn fn) {
  for (const FnInfo& f : kFunctions)
    if (f.fn == fn) return f;
  return kFunctions[0];
}

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Grammar, loosest first:
//   compare := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)*
//   sum     := product (('+' | '-') product)*
//   product := unary (('*' | '/') unary)*
//   unary   := ('-' | '+') unary | primary
//   primary := number | name | function '(' compare (',' compare)? ')' | '(' compare ')'
class Parser {
 public:
  Parser(std::string_view who, std::string_view text, const std::vector<std::string>& vars,
         const std::vector<std::string>& params)
      : who_(who), text_(text), vars_(vars), params_(params) {}

  Ast run() {
    skip_space();
    if (pos_ == text_.size()) fail("empty expression", 0);
    ast_.root = compare();
    skip_space();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'", pos_);
    return std::move(ast_);
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::size_t at) const {
    throw ExpressionError(std::string(who_), what, static_cast<int>(at) + 1, std::string(text_));
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  // Consumes `op` when it comes next (and, for '<' and '>', is not the start of '<=' / '>=').
  bool accept(std::string_view op) {
    skip_space();
    if (text_.substr(pos_, op.size()) != op) return false;
    if (op.size() == 1 && (op == "<" || op == ">") && text_.substr(pos_ + 1, 1) == "=") return false;
    pos_ += op.size();
    return true;
  }

  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(std::string("expected '") + c + "'", pos_);
    ++pos_;
  }

  int add(Node n) {
    ast_.nodes.push_back(n);
    return static_cast<int>(ast_.nodes.size()) - 1;
  }
  int binary(Kind k, int lhs, int rhs) { return add(Node{.kind = k, .lhs = lhs, .rhs = rhs}); }

  // next (op next)* for one precedence level's operators, left to right; "<=" is tried before "<".
  int level(int (Parser::*next)(), std::initializer_list<std::pair<const char*, Kind>> ops) {
    int lhs = (this->*next)();
    for (;;) {
      const auto* op = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return accept(o.first); });
      if (op == ops.end()) return lhs;
      lhs = binary(op->second, lhs, (this->*next)());
    }
  }

  int compare() {
    return level(&Parser::sum, {{"<=", Kind::le}, {">=", Kind::ge}, {"==", Kind::eq},
                                {"!=", Kind::ne}, {"<", Kind::lt}, {">", Kind::gt}});
  }
  int sum() { return level(&Parser::product, {{"+", Kind::add}, {"-", Kind::sub}}); }
  int product() { return level(&Parser::unary, {{"*", Kind::mul}, {"/", Kind::div}}); }

  int unary() {
    if (accept("-")) return add(Node{.kind = Kind::neg, .lhs = unary()});
    if (accept("+")) return unary();
    return primary();
  }

  int primary() {
    skip_space();
    const std::size_t start = pos_;
    if (pos_ == text_.size()) fail("expected a number, a name or '(' but the expression ends", pos_);
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      const int inner = compare();
      expect(')');
      return inner;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number(start);
    if (!ident_start(c)) fail("unexpected '" + std::string(1, c) + "'", pos_);
    while (pos_ < text_.size() && ident_char(text_[pos_])) ++pos_;
    const std::string name(text_.substr(start, pos_ - start));
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '(') return call(name, start);
    if (auto it = std::find(vars_.begin(), vars_.end(), name); it != vars_.end())
      return add(Node{.kind = Kind::var, .index = static_cast<int>(it - vars_.begin())});
    if (auto it = std::find(params_.begin(), params_.end(), name); it != params_.end())
      return add(Node{.kind = Kind::param, .index = static_cast<int>(it - params_.begin())});
    if (find_function(name)) fail("function '" + name + "' needs '(' and its arguments", start);
    fail("unknown name '" + name + "'", start);
  }

  int call(const std::string& name, std::size_t start) {
    const FnInfo* f = find_function(name);
    if (!f) fail("unknown function '" + name + "'", start);
    expect('(');
    Node n{.kind = Kind::call, .fn = f->fn, .lhs = compare()};
    if (f->arity == 2) {
      expect(',');
      n.rhs = compare();
    }
    skip_space();
    if (f->arity == 1 && pos_ < text_.size() && text_[pos_] == ',') fail("'" + name + "' takes one argument", pos_);
    expect(')');
    return add(n);
  }

  int number(std::size_t start) {
    // Digits, one '.', an exponent: strtod alone would also take "inf", hex and "1e".
    while (pos_ < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.')) ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      std::size_t e = pos_ + 1;
      if (e < text_.size() && (text_[e] == '+' || text_[e] == '-')) ++e;
      if (e < text_.size() && std::isdigit(static_cast<unsigned char>(text_[e]))) {
        pos_ = e;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      }
    }
    const std::string s(text_.substr(start, pos_ - start));
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || std::count(s.begin(), s.end(), '.') > 1)
      fail("malformed number '" + s + "'", start);
    if (!std::isfinite(v)) fail("number '" + s + "' is out of range", start);
    return add(Node{.kind = Kind::number, .value = v});
  }

  std::string_view who_, text_;
  const std::vector<std::string>& vars_;
  const std::vector<std::string>& params_;
  std::size_t pos_ = 0;
  Ast ast_;
};

const char* op_text(Kind k) {
  switch (k) {
    case Kind::add: return " + ";
    case Kind::sub: return " - ";
    case Kind::mul: return " * ";
    case Kind::div: return " / ";
    case Kind::lt: return " < ";
    case Kind::le: return " <= ";
    case Kind::gt: return " > ";
    case Kind::ge: return " >= ";
    case Kind::eq: return " == ";
    case Kind::ne: return " != ";
    default: return "";
  }
}

void collect_vars(const Ast& ast, int node, std::vector<int>& out) {
  const Node& n = ast.nodes[static_cast<std::size_t>(node)];
  if (n.kind == Kind::var && std::find(out.begin(), out.end(), n.index) == out.end()) out.push_back(n.index);
  if (n.lhs >= 0) collect_vars(ast, n.lhs, out);
  if (n.rhs >= 0) collect_vars(ast, n.rhs, out);
}

int copy_subtree(const Ast& from, int node, const std::vector<int>& renumber, Ast& to) {
  Node n = from.nodes[static_cast<std::size_t>(node)];
  if (n.kind == Kind::var) n.index = renumber[static_cast<std::size_t>(n.index)];
  if (n.lhs >= 0) n.lhs = copy_subtree(from, n.lhs, renumber, to);
  if (n.rhs >= 0) n.rhs = copy_subtree(from, n.rhs, renumber, to);
  to.nodes.push_back(n);
  return static_cast<int>(to.nodes.size()) - 1;
}

}  // namespace

Ast parse(std::string_view who, std::string_view text, const std::vector<std::string>& vars,
          const std::vector<std::string>& params) {
  return Parser(who, text, vars, params).run();
}

// Every value is in C: literals and params are cast like the CPU evaluator casts them, and a
// comparison's bool becomes C(0) or C(1), so kiln::math's templates deduce C throughout.
std::string to_cuda(const Ast& ast, int node, const std::vector<std::string>& var_names) {
  const Node& n = ast.nodes[static_cast<std::size_t>(node)];
  auto sub = [&](int i) { return to_cuda(ast, i, var_names); };
  switch (n.kind) {
    case Kind::number: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "C(%.17g)", n.value);
      return buf;
    }
    case Kind::var: return var_names[static_cast<std::size_t>(n.index)];
    case Kind::param: return "C(p" + std::to_string(n.index) + ")";
    case Kind::neg: return "(-" + sub(n.lhs) + ")";
    case Kind::add: case Kind::sub: case Kind::mul: case Kind::div:
      return std::string("(").append(sub(n.lhs)).append(op_text(n.kind)).append(sub(n.rhs)).append(")");
    case Kind::lt: case Kind::le: case Kind::gt: case Kind::ge: case Kind::eq: case Kind::ne:
      return "C(" + sub(n.lhs) + op_text(n.kind) + sub(n.rhs) + ")";
    case Kind::call: {
      std::string s = std::string("kiln::math::") + info(n.fn).name + "(" + sub(n.lhs);
      if (n.rhs >= 0) s += ", " + sub(n.rhs);
      return s + ")";
    }
  }
  return "";
}

std::vector<int> vars_used(const Ast& ast, int node) {
  std::vector<int> out;
  collect_vars(ast, node, out);
  std::sort(out.begin(), out.end());
  return out;
}

Ast extract(const Ast& ast, int node, const std::vector<int>& renumber) {
  Ast out;
  out.root = copy_subtree(ast, node, renumber, out);
  return out;
}

bool is_function_name(std::string_view name) { return find_function(name) != nullptr; }

namespace {

// Appends the steps computing `node` (whose vars are not empty unless it is the root) and
// returns the slot of its result. A node of more than two vars reads each child that has
// vars from that child's own steps and keeps constant children inline.
int split_node(const Ast& ast, int node, int num_vars, int fallback, std::vector<Step>& steps) {
  const std::vector<int> vars = vars_used(ast, node);
  Step s;
  if (vars.size() <= 2) {
    std::vector<int> renumber(static_cast<std::size_t>(num_vars), -1);
    for (std::size_t k = 0; k < vars.size(); ++k) renumber[static_cast<std::size_t>(vars[k])] = static_cast<int>(k);
    s.ast = extract(ast, node, renumber);
    s.inputs = vars.empty() ? std::vector<int>{fallback} : vars;
  } else {
    Node n = ast.nodes[static_cast<std::size_t>(node)];
    for (int* child : {&n.lhs, &n.rhs}) {
      if (*child < 0) continue;
      if (vars_used(ast, *child).empty()) {
        *child = copy_subtree(ast, *child, {}, s.ast);
        continue;
      }
      const int slot = split_node(ast, *child, num_vars, fallback, steps);
      s.ast.nodes.push_back(Node{.kind = Kind::var, .index = static_cast<int>(s.inputs.size())});
      s.inputs.push_back(slot);
      *child = static_cast<int>(s.ast.nodes.size()) - 1;
    }
    s.ast.nodes.push_back(n);
    s.ast.root = static_cast<int>(s.ast.nodes.size()) - 1;
  }
  steps.push_back(std::move(s));
  return num_vars + static_cast<int>(steps.size()) - 1;
}

}  // namespace

std::vector<Step> split(const Ast& ast, int num_vars, int fallback) {
  std::vector<Step> steps;
  split_node(ast, ast.root, num_vars, fallback, steps);
  return steps;
}

}  // namespace expr
}  // namespace kiln
