#pragma once
// Gradient checks: backward against central finite differences, in f64.
//
//   auto r = kiln::testing::gradcheck([](const auto& x) { return mul(x[0], x[1]); }, {a, b});
//   CHECK_MESSAGE(r.ok, r.message);
//
// Inputs are f64 tensors on any device (the copies made here keep the device). Every
// floating output is contracted with a fixed random cotangent, so non-scalar outputs and
// several outputs are checked at once. gradcheck_op walks a registry entry's TestHints.
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "kiln/kiln.h"

namespace kiln::testing {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch, or a summary
  double max_abs_error = 0;
};

using MultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
using SingleFn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace detail {

// sum_k <outputs[k], cotangents[k]> in f64 on the host.
inline double contract(const std::vector<Tensor>& outs, const std::vector<std::vector<double>>& cot) {
  double s = 0;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (!is_floating(outs[k].dtype())) continue;
    std::vector<double> v = outs[k].to_vector<double>();
    for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * cot[k][i];
  }
  return s;
}

inline std::vector<Tensor> leaves_from(const std::vector<std::vector<double>>& values, const std::vector<Tensor>& like,
                                       bool requires_grad) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < like.size(); ++i) {
    Tensor t = from_vector(values[i], like[i].shape(), {.dtype = DType::f64, .device = like[i].device()});
    if (requires_grad) t.requires_grad_();
    out.push_back(t);
  }
  return out;
}

}  // namespace detail

inline GradcheckResult gradcheck(const MultiFn& f, const std::vector<Tensor>& inputs, GradcheckOptions o = {}) {
  std::vector<std::vector<double>> x;
  for (const Tensor& t : inputs) {
    if (t.dtype() != DType::f64) return {false, "gradcheck needs f64 inputs, got " + std::string(dtype_name(t.dtype()))};
    x.push_back(t.to_vector<double>());
  }
  // Analytic: backward with fixed random cotangents.
  std::vector<Tensor> leaves = detail::leaves_from(x, inputs, true);
  std::vector<Tensor> outs = f(leaves);
  std::vector<std::vector<double>> cot;
  std::vector<Tensor> roots, grads;
  Generator gen(1234);
  for (const Tensor& out : outs) {
    Tensor c = randn(out.shape(), {.dtype = DType::f64, .device = out.device()}, &gen);
    cot.push_back(c.to_vector<double>());
    if (is_floating(out.dtype()) && out.requires_grad()) {
      roots.push_back(out);
      grads.push_back(c.to(out.dtype()));
    }
  }
  if (roots.empty()) return {false, "no output requires grad"};
  backward(roots, grads);

  GradcheckResult r;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> analytic =
        leaves[i].grad().defined() ? leaves[i].grad().to_vector<double>() : std::vector<double>(x[i].size(), 0.0);
    for (std::size_t j = 0; j < x[i].size(); ++j) {
      NoGradGuard no_grad;
      auto xp = x, xm = x;
      xp[i][j] += o.eps;
      xm[i][j] -= o.eps;
      const double fp = detail::contract(f(detail::leaves_from(xp, inputs, false)), cot);
      const double fm = detail::contract(f(detail::leaves_from(xm, inputs, false)), cot);
      const double numeric = (fp - fm) / (2 * o.eps);
      const double err = std::fabs(numeric - analytic[j]);
      r.max_abs_error = std::max(r.max_abs_error, err);
      if (r.ok && err > o.atol + o.rtol * std::fabs(numeric)) {
        r.ok = false;
        std::ostringstream msg;
        msg << "input " << i << " element " << j << ": backward " << analytic[j] << ", finite differences " << numeric;
        r.message = msg.str();
      }
    }
  }
  if (r.ok) r.message = "max abs error " + std::to_string(r.max_abs_error);
  return r;
}

inline GradcheckResult gradcheck(const SingleFn& f, const std::vector<Tensor>& inputs, GradcheckOptions o = {}) {
  return gradcheck(MultiFn([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x)}; }), inputs, o);
}

// Input shapes gradcheck_op tries for an op of `n` inputs: equal shapes, a scalar, and
// broadcasting pairs unless the op asks for same-shape inputs.
inline std::vector<std::vector<Shape>> gradcheck_shapes(int n, bool same_shape) {
  std::vector<std::vector<Shape>> cases;
  for (const Shape& s : {Shape{3, 4}, Shape{}, Shape{2, 3, 2}}) cases.push_back(std::vector<Shape>(n, s));
  if (n == 2 && !same_shape) {
    cases.push_back({{3, 1}, {4}});
    cases.push_back({{}, {2, 3}});
  }
  return cases;
}

// Input shape sets of gradcheck_op: the op's TestHints shapes when it has them and every input
// is floating (those small enough for finite differences), else gradcheck_shapes.
inline std::vector<std::vector<Shape>> gradcheck_op_shapes(const OpDef& op) {
  bool fixed_dtype = false;
  for (const InputHint& h : op.test.inputs) fixed_dtype = fixed_dtype || h.dtype.has_value();
  if (op.test.shapes.empty() || fixed_dtype) return gradcheck_shapes(op.num_inputs, op.test.same_shape_inputs);
  std::vector<std::vector<Shape>> sets;
  for (const auto& set : op.test.shapes) {
    std::int64_t n = 0;
    for (const Shape& s : set) n += shape_numel(s);
    if (n <= 1000) sets.push_back(set);
  }
  return sets;
}

// Checks every TestHints case of a differentiable op on `device`, each input in its own hinted
// range where it has one. A case the op rejects with a ShapeError or a ValueError (attrs that
// do not fit a shape) is skipped. Returns one line per failure.
inline std::vector<std::string> gradcheck_op(const OpDef& op, Device device = Device::cpu(), GradcheckOptions o = {}) {
  std::vector<std::string> failures;
  if (!op.vjp || !op.test.gradcheck || op.num_inputs <= 0) return failures;
  if (!op.dtypes.empty() && std::find(op.dtypes.begin(), op.dtypes.end(), DType::f64) == op.dtypes.end()) return failures;
  Generator gen(99);
  for (const Attrs& attrs : op.test.attrs) {
    for (const auto& shapes : gradcheck_op_shapes(op)) {
      std::vector<Tensor> inputs;
      std::string name = op.name + "(dtype=f64, shapes=";
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const InputHint hint = i < op.test.inputs.size() ? op.test.inputs[i] : InputHint{};
        const bool own = hint.low < hint.high;
        const double low = own ? hint.low : op.test.low, high = own ? hint.high : op.test.high;
        Tensor u = rand(shapes[i], {.dtype = DType::f64}, &gen);
        inputs.push_back(add(mul(u, high - low), low).to(device));
        name += shape_str(shapes[i]);
      }
      name += attrs.items().empty() ? ")" : ", " + attrs.str() + ")";
      try {
        // Outputs past differentiable_outputs (saved statistics, masks) carry no gradient.
        auto f = [&](const std::vector<Tensor>& x) {
          std::vector<Tensor> outs = dispatch(op, x, attrs);
          if (op.differentiable_outputs >= 0) outs.resize(static_cast<std::size_t>(op.differentiable_outputs));
          return outs;
        };
        GradcheckResult r = gradcheck(MultiFn(f), inputs, o);
        if (!r.ok) failures.push_back(name + ": " + r.message);
      } catch (const ShapeError&) {
        // These attrs do not apply to this shape.
      } catch (const ValueError&) {
        // Nor to these sizes (one value per channel in training, say).
      } catch (const Error& e) {
        failures.push_back(name + ": threw " + e.what());
      }
    }
  }
  return failures;
}

}  // namespace kiln::testing
