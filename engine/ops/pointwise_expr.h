#pragma once
// The expression language of user pointwise ops (kiln/pointwise.h): a recursive-descent
// parser into a flat AST, a host evaluator in the compute type, and the CUDA text that the
// elementwise templates splice in as ${OP}. Both follow kernel_templates/prelude.cu.
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::expr {

enum class Kind { number, var, param, neg, add, sub, mul, div, lt, le, gt, ge, eq, ne, call };

// The prelude's kiln::math functions an expression may call.
enum class Fn {
  exp, log, log1p, expm1, sqrt, rsqrt, sin, cos, tanh, erf, floor, ceil, rint,
  abs, sign, relu, sigmoid, silu, gelu, softplus, pow, maximum, minimum
};

struct Node {
  Kind kind = Kind::number;
  double value = 0;  // number
  int index = 0;     // var or param index
  Fn fn = Fn::exp;   // call
  int lhs = -1, rhs = -1;  // operands / arguments (rhs only for binary operators and 2-argument calls)
};

// An expression over vars (tensors) and params; nodes[root] is the whole expression.
struct Ast {
  std::vector<Node> nodes;
  int root = -1;
};

// Throws ExpressionError "[<who>] <what> at column <n> in "<text>"" for a syntax error or a
// name that is not a var, a param or a function of Fn.
Ast parse(std::string_view who, std::string_view text, const std::vector<std::string>& vars,
          const std::vector<std::string>& params);

bool is_function_name(std::string_view name);

// The CUDA expression in compute type C: var i is spelled var_names[i], param i is p<i>.
std::string to_cuda(const Ast& ast, int node, const std::vector<std::string>& var_names);

// Distinct var indices used under `node`, ascending.
std::vector<int> vars_used(const Ast& ast, int node);

// The subtree at `node` with each var renumbered by `renumber` (old index -> new index).
Ast extract(const Ast& ast, int node, const std::vector<int>& renumber);

// One kernel of a split expression: `ast` over `inputs`, each a var of the whole expression
// (index < num_vars) or the result of an earlier step (num_vars + the step's index).
struct Step {
  Ast ast;
  std::vector<int> inputs;
};
// The expression as steps of one or two inputs each (the elementwise templates take no
// more); the last step is the whole expression. Without vars it reads var `fallback`, unused.
std::vector<Step> split(const Ast& ast, int num_vars, int fallback);

// Value at `node` for vars and params, in the kernels' compute type C (float or double).
template <class C>
C eval(const Ast& ast, int node, const C* vars, const double* params) {
  const Node& n = ast.nodes[static_cast<std::size_t>(node)];
  auto arg = [&](int i) { return eval<C>(ast, i, vars, params); };
  switch (n.kind) {
    case Kind::number: return static_cast<C>(n.value);
    case Kind::var: return vars[n.index];
    case Kind::param: return static_cast<C>(params[n.index]);
    case Kind::neg: return -arg(n.lhs);
    case Kind::add: return arg(n.lhs) + arg(n.rhs);
    case Kind::sub: return arg(n.lhs) - arg(n.rhs);
    case Kind::mul: return arg(n.lhs) * arg(n.rhs);
    case Kind::div: return arg(n.lhs) / arg(n.rhs);
    case Kind::lt: return C(arg(n.lhs) < arg(n.rhs));
    case Kind::le: return C(arg(n.lhs) <= arg(n.rhs));
    case Kind::gt: return C(arg(n.lhs) > arg(n.rhs));
    case Kind::ge: return C(arg(n.lhs) >= arg(n.rhs));
    case Kind::eq: return C(arg(n.lhs) == arg(n.rhs));
    case Kind::ne: return C(arg(n.lhs) != arg(n.rhs));
    case Kind::call: break;
  }
  const C x = arg(n.lhs);
  switch (n.fn) {
    case Fn::exp: return std::exp(x);
    case Fn::log: return std::log(x);
    case Fn::log1p: return std::log1p(x);
    case Fn::expm1: return std::expm1(x);
    case Fn::sqrt: return std::sqrt(x);
    case Fn::rsqrt: return C(1) / std::sqrt(x);
    case Fn::sin: return std::sin(x);
    case Fn::cos: return std::cos(x);
    case Fn::tanh: return std::tanh(x);
    case Fn::erf: return std::erf(x);
    case Fn::floor: return std::floor(x);
    case Fn::ceil: return std::ceil(x);
    case Fn::rint: return std::nearbyint(x);
    case Fn::abs: return std::fabs(x);
    case Fn::sign: return static_cast<C>(static_cast<int>(C(0) < x) - static_cast<int>(x < C(0)));
    case Fn::relu: return (x != x || x > C(0)) ? x : C(0);
    case Fn::sigmoid: return C(1) / (C(1) + std::exp(-x));
    case Fn::silu: return x / (C(1) + std::exp(-x));
    case Fn::gelu: return C(0.5) * x * (C(1) + std::erf(x * C(0.70710678118654752440)));
    case Fn::softplus: return x > C(20) ? x : static_cast<C>(std::log1p(std::exp(x)));
    case Fn::pow: return std::pow(x, arg(n.rhs));
    case Fn::maximum: {
      const C y = arg(n.rhs);
      return x != x ? x : y != y ? y : (x > y ? x : y);
    }
    case Fn::minimum: {
      const C y = arg(n.rhs);
      return x != x ? x : y != y ? y : (x < y ? x : y);
    }
  }
  return x;
}

}  // namespace kiln::expr
