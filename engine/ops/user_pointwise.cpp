// User pointwise ops (kiln/pointwise.h). A definition becomes ordinary OpDefs whose
// PointwiseExpr is the emitted CUDA text, so kernel specs, the disk cache and (later) fusion
// see them as built-in ops. Gradient i is the user op "<name>.grad_<input>", or the steps
// "<name>.grad_<input>.<k>" when it reads more than the two tensors a kernel takes.
#include "ops/sum_to.h"
#include "core/dtype_sets.h"
#include "user_pointwise.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "elementwise_common.h"
#include "kiln/pointwise.h"
#include "pointwise_expr.h"

namespace kiln {

namespace {

struct Definition {
  std::string expr;
  std::vector<std::string> inputs, params, grads;
  bool operator==(const Definition&) const = default;
};

// One kernel of a gradient. Slots: the op's inputs 0..n-1, then y, g, then earlier steps.
struct GradStep {
  const OpDef* op;
  std::vector<int> slots;
};

struct UserOp {
  Definition def;
  const OpDef* op = nullptr;
  std::vector<std::vector<GradStep>> grads;  // per input; empty: not differentiable
};

struct UserOps {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<UserOp>, std::less<>> by_name;
  std::set<const OpDef*> defs;  // forward ops and gradient steps
};

UserOps& user_ops() {
  static UserOps u;
  return u;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += (s.empty() ? "" : ", ") + e;
  return s;
}

// The op of one expression over one or two tensors, its params read from the call's attrs
// (named as the user named them; a missing one is 0).
OpDef make_def(const std::string& name, const expr::Ast& ast, int arity, const std::vector<PointwiseParam>& params) {
  static const std::vector<std::string> kUnaryNames{"x"}, kBinaryNames{"a", "b"};
  PointwiseExpr pw{.expr = expr::to_cuda(ast, ast.root, arity == 1 ? kUnaryNames : kBinaryNames),
                   .domain = elementwise_defs::PointwiseDomain::floating};
  Attrs defaults;
  if (!params.empty()) {
    std::vector<std::string> names;
    for (const PointwiseParam& p : params) {
      names.push_back(p.name);
      defaults.set(p.name, p.value);
    }
    pw.params = [names](const Attrs& at) {
      return std::pair{at.get_or<double>(names[0], 0.0), names.size() > 1 ? at.get_or<double>(names[1], 0.0) : 0.0};
    };
  }
  auto eval = [ast](auto x, double p0, double p1) {
    const double p[2] = {p0, p1};
    return expr::eval<decltype(x)>(ast, ast.root, &x, p);
  };
  OpDef d = arity == 1 ? elementwise_defs::unary_def<true, false>(name, dtype_sets::floating, rules::promote_float, eval, std::move(pw))
                       : elementwise_defs::binary_def<true, false>(
                             name, dtype_sets::floating, rules::promote_float, [](auto u, auto) { return u; }, std::move(pw));
  if (arity == 2) {
    // binary_def's host loop takes no params; this one reads them like the unary one.
    d.cpu = [ast](const OpArgs& a, std::span<Tensor> out) {
      const auto [p0, p1] = pointwise_params(a.op, a.attrs);
      const double p[2] = {p0, p1};
      elementwise_defs::cpu_binary<true, false>(a.inputs[0], a.inputs[1], out[0], [&](auto u, auto v) {
        const decltype(u) vars[2] = {u, v};
        return expr::eval<decltype(u)>(ast, ast.root, vars, p);
      });
    };
  }
  d.test.attrs = {defaults};
  return d;
}

const OpDef& register_user_op(UserOps& u, OpDef def) {
  const std::string name = def.name;
  if (find_op(name)) throw ValueError("[pointwise " + name + "] the name belongs to another op");
  const OpDef& op = register_op(std::move(def));
  u.defs.insert(&op);
  return op;
}

// grads[i] = sum_to(steps(inputs, y, g), input i's shape); the steps run as ordinary ops.
Vjp make_vjp(const UserOp* user) {
  return [user](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
    const int n = c.num_inputs();
    std::vector<Tensor> out(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      if (!c.needs_grad(i)) continue;
      std::vector<Tensor> results;
      auto slot = [&](int s) -> Tensor {
        if (s < n) return c.saved_input(s);
        if (s == n) return c.saved_output(0);
        if (s == n + 1) return g[0];
        return results[static_cast<std::size_t>(s - n - 2)];
      };
      for (const GradStep& step : user->grads[static_cast<std::size_t>(i)]) {
        std::vector<Tensor> args;
        for (int s : step.slots) args.push_back(slot(s));
        results.push_back(dispatch(*step.op, args, c.attrs())[0]);
      }
      Tensor r = results.back();
      // A gradient that reads neither g nor y may be smaller than the output.
      if (r.shape() != c.output(0).shape) r = broadcast_to(r, c.output(0).shape);
      out[static_cast<std::size_t>(i)] = sum_to(r, c.input(i).shape);
    }
    return out;
  };
}

// Parses everything before registering anything, so a bad gradient leaves no op behind.
std::unique_ptr<UserOp> define(UserOps& u, const std::string& name, Definition def,
                               const std::vector<PointwiseParam>& params) {
  const std::string who = "pointwise " + name;
  const int n = static_cast<int>(def.inputs.size());
  std::vector<std::string> names = def.inputs;
  names.insert(names.end(), def.params.begin(), def.params.end());
  for (const std::string& s : names) {
    if (!is_identifier(s) || expr::is_function_name(s) || s == "y" || s == "g")
      throw ValueError("[" + who + "] '" + s + "' cannot name an input or param (an identifier other than y, g " +
                       "and the functions)");
    if (std::count(names.begin(), names.end(), s) > 1)
      throw ValueError("[" + who + "] the name '" + s + "' is given twice");
  }
  if (def.params.size() > 2)
    throw ValueError("[" + who + "] takes at most 2 params, got " + std::to_string(def.params.size()));
  if (!def.grads.empty() && static_cast<int>(def.grads.size()) != n)
    throw ValueError("[" + who + "] needs one gradient expression per input (" + std::to_string(n) + "), got " +
                     std::to_string(def.grads.size()));

  const expr::Ast forward = expr::parse(who, def.expr, def.inputs, def.params);
  std::vector<std::string> grad_vars = def.inputs;
  grad_vars.insert(grad_vars.end(), {"y", "g"});
  std::vector<std::vector<expr::Step>> grad_steps;
  for (int i = 0; i < static_cast<int>(def.grads.size()); ++i) {
    const expr::Ast ast = expr::parse(who + ".grad_" + def.inputs[static_cast<std::size_t>(i)],
                                      def.grads[static_cast<std::size_t>(i)], grad_vars, def.params);
    grad_steps.push_back(expr::split(ast, n + 2, n + 1));
  }

  auto user = std::make_unique<UserOp>();
  SavePolicy save;
  for (const auto& steps : grad_steps) {
    user->grads.emplace_back();
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const expr::Step& st = steps[k];
      std::string step_name = name + ".grad_" + def.inputs[user->grads.size() - 1];
      if (steps.size() > 1) step_name += "." + std::to_string(k);
      const OpDef& op = register_user_op(u, make_def(step_name, st.ast, static_cast<int>(st.inputs.size()), params));
      user->grads.back().push_back({&op, st.inputs});
      for (int s : st.inputs) {
        auto& list = s < n ? save.inputs : save.outputs;
        const int index = s < n ? s : 0;
        if (s <= n && std::find(list.begin(), list.end(), index) == list.end()) list.push_back(index);
      }
    }
  }
  OpDef fwd = make_def(name, forward, n, params);
  fwd.num_inputs = n;
  if (!def.grads.empty()) {
    fwd.vjp = make_vjp(user.get());
    fwd.save = std::move(save);
  }
  user->op = &register_user_op(u, std::move(fwd));
  user->def = std::move(def);
  return user;
}

}  // namespace

bool is_user_pointwise(const OpDef& op) {
  UserOps& u = user_ops();
  std::lock_guard lock(u.mu);
  return u.defs.count(&op) > 0;
}

Tensor pointwise(const std::string& name, const std::string& expr, const std::vector<Tensor>& inputs,
                 const PointwiseOptions& options) {
  if (!is_identifier(name)) throw ValueError("[pointwise] '" + name + "' is not a valid op name (a C identifier)");
  const std::string who = "[pointwise " + name + "] ";
  if (inputs.empty() || inputs.size() > 2)
    throw ValueError(who + "takes 1 or 2 tensors, got " + std::to_string(inputs.size()));
  Definition def{.expr = expr, .inputs = options.inputs, .params = {}, .grads = options.grads};
  if (def.inputs.empty())
    def.inputs = inputs.size() == 1 ? std::vector<std::string>{"x"} : std::vector<std::string>{"a", "b"};
  if (def.inputs.size() != inputs.size())
    throw ValueError(who + "names " + std::to_string(def.inputs.size()) + " inputs (" + join(def.inputs) +
                     ") but got " + std::to_string(inputs.size()) + " tensors");
  Attrs attrs;
  for (const PointwiseParam& p : options.params) {
    def.params.push_back(p.name);
    attrs.set(p.name, p.value);
  }

  const UserOp* user = nullptr;
  {
    UserOps& u = user_ops();
    std::lock_guard lock(u.mu);
    auto it = u.by_name.find(name);
    if (it == u.by_name.end()) it = u.by_name.emplace(name, define(u, name, def, options.params)).first;
    user = it->second.get();
  }
  const Definition& have = user->def;
  if (!(have == def))
    throw ValueError(who + "is already registered as \"" + have.expr + "\" (inputs: " + join(have.inputs) +
                     "; params: " + join(have.params) + "; " + std::to_string(have.grads.size()) +
                     " gradients); a different definition needs another name");
  if (have.grads.empty() && grad_enabled())
    for (const Tensor& t : inputs)
      if (t.defined() && t.requires_grad())
        throw ValueError(who +
                         "an input requires grad but the op has no gradient expressions (give options.grads, "
                         "or detach the input)");
  return dispatch(*user->op, inputs, attrs)[0];
}

}  // namespace kiln
